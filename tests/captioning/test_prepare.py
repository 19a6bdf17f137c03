import json

import pytest

from captioning import prepare as prep
from captioning.fixtures import DEMO_IMAGE_ID, tokenize, write_karpathy_fixture
from captioning.prepare import CaptionDataError, build_vocabulary, load_karpathy, prepare


def _image(split, sentences, cocoid=1):
    return {"filepath": "val2014", "filename": f"COCO_val2014_{cocoid:012d}.jpg", "imgid": 0, "split": split,
            "cocoid": cocoid, "sentids": list(range(len(sentences))),
            "sentences": [{"tokens": s.split(), "raw": s, "imgid": 0, "sentid": i} for i, s in enumerate(sentences)]}


@pytest.mark.realdata
def test_fixture_is_karpathy_format_with_real_split_ids(tmp_path, attn_data_root):
    lists = attn_data_root / "coco" / "updown"
    paths = write_karpathy_fixture(tmp_path, {"train": 3, "restval": 1, "val": 2, "test": 2}, split_lists=lists,
                                   include_demo_image=True)
    data = json.loads(paths["dataset"].read_text())
    assert data["dataset"] == "coco"
    by_split = {}
    for image in data["images"]:
        assert set(image) == {"filepath", "filename", "imgid", "split", "cocoid", "sentids", "sentences"}
        assert image["sentids"] == [s["sentid"] for s in image["sentences"]] and len(image["sentences"]) == 5
        assert all(s["tokens"] == tokenize(s["raw"]) and s["imgid"] == image["imgid"] for s in image["sentences"])
        by_split.setdefault(image["split"], []).append(image)
    test_lines = (lists / "karpathy_test_images.txt").read_text().split("\n")[:2]
    assert [f"{i['filepath']}/{i['filename']} {i['cocoid']}" for i in by_split["test"]] == test_lines
    assert DEMO_IMAGE_ID in [i["cocoid"] for i in by_split["restval"]]
    assert all(i["filepath"] == "train2014" for i in by_split["train"])


def test_vocabulary_threshold_counts_training_captions_only():
    images = [_image("train", ["a dog"] * 4 + ["a cat"], 1), _image("restval", ["a cat"] * 4, 2),
              _image("test", ["a bird"] * 9, 3)]
    vocab = build_vocabulary(images, min_count=5)
    assert "a" in vocab and "cat" in vocab          # 9 and 5 training occurrences
    assert "dog" not in vocab                       # 4 < 5: becomes <unk>
    assert "bird" not in vocab                      # test captions are not counted
    assert vocab.encode(["a", "dog"]) == [vocab.index("a"), vocab.unk]


def test_prepare_truncates_and_keeps_raw_references(tmp_path):
    long = " ".join(["word"] * 20)
    dataset = tmp_path / "dataset_coco.json"
    dataset.write_text(json.dumps({"images": [_image("train", [long] * 5, 7)]}))
    summary = prepare(dataset, tmp_path / "out", min_count=1, max_length=16)
    data = json.loads((tmp_path / "out" / "captions.json").read_text())
    (image,) = data["images"]
    assert summary["vocab_size"] == 5 and image["image_id"] == 7
    assert all(len(c) == 16 for c in image["captions"]) and image["references"] == [long] * 5
    assert image["file_path"] == "val2014/COCO_val2014_000000000007.jpg"


@pytest.mark.parametrize("broken, field", [
    (lambda d: d["images"][0].pop("sentences"), "'sentences'"),
    (lambda d: d["images"][0].update(split="holdout"), "split 'holdout'"),
    (lambda d: d["images"][0]["sentences"][1].pop("tokens"), "sentences[1]"),
    (lambda d: d.pop("images"), "'images'"),
])
def test_bad_dataset_json_names_file_and_field(tmp_path, broken, field):
    data = {"images": [_image("train", ["a dog", "a cat"], 5)]}
    broken(data)
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CaptionDataError) as err:
        load_karpathy(path)
    assert str(path) in str(err.value) and field in str(err.value)


def test_missing_dataset_says_where_to_get_it(tmp_path, capsys):
    assert prep.main(["--data-root", str(tmp_path)]) == 2
    message = capsys.readouterr().err
    assert str(tmp_path / "coco" / "dataset_coco.json") in message and "karpathy" in message.lower()


KARPATHY_FIX = ("download Karpathy's caption_datasets.zip (https://cs.stanford.edu/people/karpathy/deepimagesent/) and "
                "put dataset_coco.json there")


@pytest.mark.parametrize("text, reason", [("", "the file is empty"), ("\n  \n", "the file holds only blank lines"),
                                          ('{"images": []}', "its 'images' list is empty")])
def test_a_dataset_json_without_images_names_the_file_and_the_fix(tmp_path, text, reason):
    path = tmp_path / "dataset_coco.json"
    path.write_text(text)
    with pytest.raises(CaptionDataError) as err:
        load_karpathy(path)
    assert str(err.value) == f"{path}: no images: {reason}; {KARPATHY_FIX}"


def test_no_training_captions_or_no_word_kept_names_the_file(tmp_path):
    dataset = tmp_path / "dataset_coco.json"
    dataset.write_text(json.dumps({"images": [_image("test", ["a dog"] * 5, 1)]}))
    with pytest.raises(CaptionDataError) as err:
        prepare(dataset, tmp_path / "out")
    assert str(err.value) == (f"{dataset}: no training captions (no image of split 'train' or 'restval') to build "
                              f"the vocabulary from; {KARPATHY_FIX}")
    dataset.write_text(json.dumps({"images": [_image("train", ["a dog", "a cat", "one bird"], 1)]}))
    with pytest.raises(CaptionDataError) as err:
        prepare(dataset, tmp_path / "out", min_count=3)
    assert str(err.value) == (f"{dataset}: no word of the training captions occurs 3 times (the most frequent, 'a', "
                              f"occurs 2); lower --min-count")
    assert not (tmp_path / "out").exists()
