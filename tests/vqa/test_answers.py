"""Answer normalisation (official tables), MCAN soft scores and the answer vocabulary."""
import json

import pytest
import torch

from vqa.answers import AnswerVocab, normalize_answer, prep_answer, process_punctuation, soft_score


@pytest.mark.parametrize("raw, expected", [
    ("Two", "2"),                       # number words to digits, lower-cased
    ("none", "0"),
    ("a dog", "dog"),                   # articles dropped
    ("The Red Car", "red car"),
    ("dont know", "don't know"),        # contractions restored
    ("isnt", "isn't"),
    ("yes.", "yes"),                    # periods not followed by a digit go
    ("3.5", "3.5"),                     # a decimal point stays
    ("t-shirt", "t shirt"),             # punctuation not touching a space becomes a space
    ("t - shirt", "t shirt"),           # ... and is deleted when it touches one
    ("1,000", "1000"),                  # a comma between digits deletes every mark
    ("red, white", "red white"),
    ("  yes\n", "yes"),
    ("hot dog!", "hot dog"),
])
def test_normalize_answer_official_rules(raw, expected):
    assert normalize_answer(raw) == expected


def test_punctuation_rule_is_decided_on_the_whole_text():
    # '-' touches no space, but '1,5' holds a digit comma: every mark is deleted, none spaced
    assert process_punctuation("1,5 x-ray") == "15 xray"
    assert process_punctuation("x-ray") == "x ray"


def test_prep_answer_drops_commas_like_mcan():
    assert prep_answer("red,white") == "red white"      # ',' not touching a space -> ' '
    assert prep_answer("Two") == "2"


@pytest.mark.parametrize("count, score", [(0, 0.0), (1, 0.3), (2, 0.6), (3, 0.9), (4, 1.0), (7, 1.0), (10, 1.0)])
def test_soft_score_matches_mcan_table(count, score):
    assert soft_score(count) == score


def test_soft_score_rejects_negative_counts():
    with pytest.raises(ValueError, match="negative"):
        soft_score(-1)


def test_soft_target_counts_normalised_answers():
    vocab = AnswerVocab(["yes", "no", "2", "dog"])
    humans = ["yes"] * 4 + ["Yes."] * 2 + ["two", "2", "a dog", "cat"]   # cat: outside the vocabulary
    target = vocab.soft_target(humans)
    assert torch.allclose(target, torch.tensor([1.0, 0.0, 0.6, 0.3]))


def test_vocab_formats_round_trip(tmp_path):
    answers = ["net", "pitcher", "yes"]
    mcan = tmp_path / "answer_dict.json"
    mcan.write_text(json.dumps([{a: i for i, a in enumerate(answers)}, {str(i): a for i, a in enumerate(answers)}]))
    lx = tmp_path / "ans2label.json"
    lx.write_text(json.dumps({"yes": 2, "net": 0, "pitcher": 1}))
    label2ans = tmp_path / "label2ans.json"
    label2ans.write_text(json.dumps(answers))
    loaded = [AnswerVocab.load(p) for p in (mcan, lx, label2ans)]
    assert all(v.answers == answers for v in loaded)
    assert loaded[0].index("yes") == 2 and loaded[0].index("maybe") is None and "net" in loaded[0]
    saved = AnswerVocab.load(loaded[0].save(tmp_path / "saved.json"))
    assert saved == loaded[0]


def test_vocab_bad_files_name_the_file(tmp_path):
    gap = tmp_path / "gap.json"
    gap.write_text(json.dumps({"yes": 0, "no": 2}))
    with pytest.raises(ValueError, match="gap.json.*0..1"):
        AnswerVocab.load(gap)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        AnswerVocab.load(tmp_path / "missing.json")
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"yes": "0"}))
    with pytest.raises(ValueError, match="odd.json.*unknown answer vocabulary format"):
        AnswerVocab.load(odd)


@pytest.mark.parametrize("text, reason", [("", "the file is empty"), ("\n\n", "the file holds only blank lines"),
                                          ("{}", "the answer vocabulary is empty"),
                                          ("[]", "the answer vocabulary is empty")])
def test_a_vocab_file_without_answers_names_the_file_and_the_fix(tmp_path, text, reason):
    path = tmp_path / "answers.json"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        AnswerVocab.load(path)
    assert str(err.value) == (f"{path}: no answers: {reason}; use MCAN's core/data/answer_dict.json or LXMERT's "
                              f"data/vqa/trainval_ans2label.json (under <data-root>/vqa/)")


@pytest.mark.realdata
def test_real_answer_vocabularies_agree(attn_data_root):
    mcan = AnswerVocab.load(attn_data_root / "vqa/mcan/answer_dict.json")
    lxmert = AnswerVocab.load(attn_data_root / "vqa/lxmert/vqa/trainval_ans2label.json")
    label2ans = AnswerVocab.load(attn_data_root / "vqa/lxmert/vqa/trainval_label2ans.json")
    assert len(mcan) == len(lxmert) == 3129
    assert set(mcan.answers) == set(lxmert.answers)
    assert label2ans == lxmert
    assert mcan.answers[:4] == ["net", "pitcher", "orange", "yes"]
    # every vocabulary answer is already in normal form, so targets and predictions line up
    assert all(normalize_answer(a) == a and prep_answer(a) == a for a in mcan.answers)
