"""Official-format loading with clear errors, MCAN tokenisation, GloVe, the fixture, the dataset."""
import json

import pytest
import torch

from common.features import RegionFeatureStore
from common.text import Vocabulary
from vqa.answers import AnswerVocab
from vqa.data import (
    QuestionEncoder, VQADataError, VQADataset, build_question_vocab, load_annotations, load_glove, load_questions,
    tokenize_question,
)
from vqa.evaluation import vqa_accuracy
from vqa.fixtures import TEMPLATES, write_vqa_fixture


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    return write_vqa_fixture(tmp_path_factory.mktemp("vqa"), num_images=6, questions_per_image=4, feature_dim=16)


def test_fixture_files_are_in_the_official_format(fixture):
    questions = load_questions(fixture.questions["train2014"])
    annotations = load_annotations(fixture.annotations["train2014"])
    assert len(questions) == len(annotations) == 24
    raw = json.loads(fixture.questions["train2014"].read_text())
    assert raw["task_type"] == "Open-Ended" and raw["data_subtype"] == "train2014"
    assert {q["question_id"] for q in questions} == {a["question_id"] for a in annotations}
    assert all(q["question_id"] // 1000 == q["image_id"] for q in questions)
    assert all(len(a["answers"]) == 10 and [h["answer_id"] for h in a["answers"]] == list(range(1, 11))
               for a in annotations)
    assert {a["answer_type"] for a in annotations} <= {"yes/no", "number", "other"}
    store = RegionFeatureStore(fixture.features["train2014"])
    assert set(store.image_ids) == {q["image_id"] for q in questions}
    assert all(10 <= store.num_regions(i) <= 100 for i in store.image_ids)


def test_fixture_is_deterministic(tmp_path):
    a = write_vqa_fixture(tmp_path / "a", num_images=2, questions_per_image=2, feature_dim=8)
    b = write_vqa_fixture(tmp_path / "b", num_images=2, questions_per_image=2, feature_dim=8)
    assert a.annotations["val2014"].read_text() == b.annotations["val2014"].read_text()
    assert torch.equal(RegionFeatureStore(a.features["val2014"])[a.image_ids["val2014"][0]].features,
                       RegionFeatureStore(b.features["val2014"])[b.image_ids["val2014"][0]].features)


def test_fixture_answers_score_like_mcan(fixture):
    # the majority answer scores 100 under the official metric whenever >= 4 annotators agree,
    # and MCAN's soft targets take the values .3/.6/.9/1
    annotations = load_annotations(fixture.annotations["train2014"])
    answers = AnswerVocab.load(fixture.answers)
    targets = torch.stack([answers.soft_target([h["answer"] for h in a["answers"]]) for a in annotations])
    allowed = torch.tensor([0.0, 0.3, 0.6, 0.9, 1.0])
    assert torch.isin(targets.unique(), allowed).all() and torch.isin(allowed, targets.unique()).all()
    assert targets.max(1).values.min() > 0
    acc = vqa_accuracy(annotations, {a["question_id"]: a["multiple_choice_answer"] for a in annotations})
    assert 60 < acc.overall <= 100


def test_bad_question_file_names_file_and_field(tmp_path):
    path = tmp_path / "q.json"
    path.write_text(json.dumps({"questions": [{"image_id": 1, "question": "Why?", "question_id": "7"}]}))
    with pytest.raises(VQADataError, match=r"q.json: questions\[0\] field 'question_id' must be int"):
        load_questions(path)
    path.write_text(json.dumps({"annotations": []}))
    with pytest.raises(VQADataError, match="q.json: expected a JSON object with a 'questions' list"):
        load_questions(path)
    with pytest.raises(VQADataError, match="nothere.json does not exist.*visualqa.org"):
        load_questions(tmp_path / "nothere.json")


FILES_FIX = ("download the official VQA v2 files from https://visualqa.org/download.html into <data-root>/vqa/ "
             "(or set the path in the config)")


@pytest.mark.parametrize("load, key", [(load_questions, "questions"), (load_annotations, "annotations")])
@pytest.mark.parametrize("text, reason", [("", "the file is empty"), ("\n \n", "the file holds only blank lines"),
                                          (None, "its {key!r} list is empty")])
def test_a_file_without_entries_names_the_file_and_the_fix(tmp_path, load, key, text, reason):
    path = tmp_path / f"{key}.json"
    path.write_text(json.dumps({key: [], "info": {}}) if text is None else text)
    with pytest.raises(VQADataError) as err:
        load(path)
    assert str(err.value) == f"{path}: no {key}: {reason.format(key=key)}; {FILES_FIX}"


def test_bad_annotation_answers(tmp_path):
    path = tmp_path / "a.json"
    ann = {"question_id": 1, "image_id": 1, "question_type": "is the", "answer_type": "yes/no", "answers": []}
    path.write_text(json.dumps({"annotations": [ann]}))
    with pytest.raises(VQADataError, match="a.json: annotations\\[0\\] .* field 'answers' must be a non-empty"):
        load_annotations(path)


def test_tokenize_question_like_mcan():
    assert tokenize_question("What's the man's T-shirt color/pattern?") == \
        ["whats", "the", "mans", "t", "shirt", "color", "pattern"]


def test_question_encoder_truncates_and_maps_unknowns():
    vocab = build_question_vocab([{"question": "is the dog red?"}, {"question": "is the cat red"}])
    assert (vocab.pad, vocab.unk) == (0, 1)
    encode = QuestionEncoder(vocab, max_len=3)
    ids = encode("Is the zebra red?")
    assert ids == [vocab.index("is"), vocab.index("the"), vocab.unk]


def test_load_glove(tmp_path):
    vocab = Vocabulary(["dog", "cat", "zebra"], specials=("<pad>", "<unk>"))
    path = tmp_path / "glove.txt"
    path.write_text("the 1 1 1\ndog 0.5 -1 2\ncat 3 0 0\n")
    matrix, coverage = load_glove(path, vocab)
    assert matrix.shape == (5, 3)
    assert torch.equal(matrix[vocab.index("dog")], torch.tensor([0.5, -1.0, 2.0]))
    assert torch.equal(matrix[vocab.index("zebra")], torch.zeros(3)) and torch.equal(matrix[0], torch.zeros(3))
    assert coverage == pytest.approx(2 / 3)
    with pytest.raises(VQADataError, match="data.glove=null"):
        load_glove(tmp_path / "missing.txt", vocab)


def test_dataset_items_and_collate(fixture):
    questions = load_questions(fixture.questions["val2014"])
    annotations = load_annotations(fixture.annotations["val2014"])
    answers = AnswerVocab.load(fixture.answers)
    vocab = build_question_vocab(questions)
    store = RegionFeatureStore(fixture.features["val2014"])
    dataset = VQADataset(questions, annotations, store, answers, QuestionEncoder(vocab, 14), max_regions=100)
    item = dataset[0]
    assert item["question"] == questions[0]["question"] and item["target"].shape == (len(answers),)
    assert item["features"].shape[1] == 16
    batch = dataset.collate([dataset[i] for i in range(5)])
    assert batch["features"].shape == (5, 100, 16) and batch["region_mask"].shape == (5, 100)
    counts = [store.num_regions(dataset.questions[i]["image_id"]) for i in range(5)]
    assert batch["region_mask"].sum(1).tolist() == counts
    assert (batch["features"][~batch["region_mask"]] == 0).all()
    lengths = [len(tokenize_question(questions[i]["question"])) for i in range(5)]
    assert batch["question_mask"].sum(1).tolist() == lengths
    assert (batch["question_tokens"][~batch["question_mask"]] == vocab.pad).all()
    assert batch["target"].shape == (5, len(answers))
    test = VQADataset(questions, None, store, answers, QuestionEncoder(vocab, 14))
    assert "target" not in test[0] and "target" not in test.collate([test[0]])
    fixed = VQADataset(questions, annotations, store, answers, QuestionEncoder(vocab, 14), max_regions=100,
                       question_len=14).collate([dataset[i] for i in range(5)])  # one shape: CUDA graphs
    assert fixed["question_tokens"].shape == (5, 14) and fixed["question_mask"].sum(1).tolist() == lengths
    assert torch.equal(fixed["question_tokens"][:, :batch["question_tokens"].shape[1]], batch["question_tokens"])


def test_dataset_reports_missing_features_and_annotations(fixture):
    questions = load_questions(fixture.questions["val2014"])
    answers = AnswerVocab.load(fixture.answers)
    encode = QuestionEncoder(build_question_vocab(questions))
    with pytest.raises(VQADataError, match="train2014.h5: no region features for 6 image"):
        VQADataset(questions, None, RegionFeatureStore(fixture.features["train2014"]), answers, encode)
    annotations = load_annotations(fixture.annotations["val2014"])[1:]
    with pytest.raises(VQADataError, match="1 question\\(s\\) have no annotation"):
        VQADataset(questions, annotations, RegionFeatureStore(fixture.features["val2014"]), answers, encode)


@pytest.mark.realdata
def test_real_okvqa_questions_load_in_the_official_format(attn_data_root):
    questions = load_questions(attn_data_root / "vqa/okvqa_questions/OpenEnded_mscoco_val2014_questions.json")
    assert len(questions) == 5046
    assert questions[0] == {"image_id": 297147, "question": "What sport can you use this for?", "question_id": 2971475}
    vocab = build_question_vocab(questions)
    lengths = [len(tokenize_question(q["question"])) for q in questions]
    assert max(lengths) > 14 > sorted(lengths)[len(lengths) // 2]   # truncation at 14 matters for a few only
    assert vocab.index("sport") != vocab.unk


@pytest.mark.realdata
def test_fixture_question_types_and_answers_are_official(attn_data_root, tmp_path):
    official = (attn_data_root / "vqa/vqa_api/mscoco_question_types.txt").read_text().splitlines()
    assert len(official) == 65
    assert {t for t, _, _ in TEMPLATES} <= set(official)
    answers = AnswerVocab.load(attn_data_root / "vqa/mcan/answer_dict.json")
    fixture = write_vqa_fixture(tmp_path, num_images=2, questions_per_image=3, feature_dim=8, answers=answers)
    assert AnswerVocab.load(fixture.answers) == answers          # the real 3,129 answers, MCAN order
