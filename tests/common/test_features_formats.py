"""common.features.formats and convert: every input format round-trips into the HDF5 store; bad input
is an error naming the file, the line (or .npz file) and the field, and leaves no complete-looking output."""
import base64
import csv
import re
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from common.features import RegionFeatureError, RegionFeatureStore, layout, numeric_id
from common.features.convert import convert
from common.features.fixtures import random_region_features, write_format_fixtures
from common.features.formats import bottom_up_tsv, lxmert_tsv, mcan_npz, selfcritical_npz

DIM = 16
IDS = [42, 7, 273052, 1]
REGIONS = (3, 12)


def expected(image_id):
    return random_region_features(image_id, REGIONS, DIM)


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    return write_format_fixtures(tmp_path_factory.mktemp("formats"), IDS, num_regions=REGIONS, feature_dim=DIM)


def readers(paths, feature_dim=None):
    """Each format's (entries, sources) over the fixture."""
    root = paths["selfcritical-npz"]
    sizes = selfcritical_npz.load_image_sizes(root / "image_info.json")
    return {
        "bottom-up-tsv": (bottom_up_tsv.entries(paths["bottom-up-tsv"], feature_dim),
                          [bottom_up_tsv.source(paths["bottom-up-tsv"])]),
        "lxmert-tsv": (lxmert_tsv.entries(paths["lxmert-tsv"], feature_dim), [lxmert_tsv.source(paths["lxmert-tsv"])]),
        "selfcritical-npz": (selfcritical_npz.entries(root / "cocobu_att", root / "cocobu_box", sizes, feature_dim),
                             selfcritical_npz.sources(root / "cocobu_att", root / "cocobu_box",
                                                      [root / "image_info.json"])),
        "mcan-npz": (mcan_npz.entries(paths["mcan-npz"], feature_dim), [mcan_npz.source(paths["mcan-npz"])]),
    }


FORMATS = ("bottom-up-tsv", "lxmert-tsv", "selfcritical-npz", "mcan-npz")


def assert_same(got, want):
    assert got.image_id == want.image_id and got.image_size == want.image_size
    assert torch.equal(got.features, want.features) and torch.equal(got.boxes, want.boxes)


def load(entries):
    return [entry.load() for entry in entries]


@pytest.mark.parametrize("name", FORMATS)
def test_reader_returns_what_the_fixture_wrote(fixtures, name):
    entries = list(readers(fixtures)[name][0])
    # TSVs keep the written order; the per-image directories are read by image id
    order = IDS if name.endswith("tsv") else sorted(IDS)
    assert [entry.image_id for entry in entries] == order
    for entry, item in zip(entries, load(entries)):
        assert_same(item, expected(item.image_id))
        assert str(fixtures[name]) in entry.place
    names = [entry.name for entry in entries]
    assert names == {"lxmert-tsv": [f"COCO_val2014_{i:012d}" for i in order],
                     "mcan-npz": [f"COCO_val2014_{i:012d}" for i in order]}.get(name, [None] * len(IDS))


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_convert_round_trips(tmp_path, fixtures, name, dtype):
    entries, sources = readers(fixtures)[name]
    counts = convert(entries, tmp_path / "out.h5", sources, feature_dim=DIM, dtype=dtype, progress=False)
    assert counts == {"written": 4, "skipped": 0, "images": 4, "unchanged": False}
    store = RegionFeatureStore(tmp_path / "out.h5")
    assert sorted(store.image_ids) == sorted(IDS) and store.sources == sources
    for image_id in IDS:
        assert_same(store[image_id], expected(image_id))
    assert list(tmp_path.iterdir()) == [tmp_path / "out.h5"]  # no partial file left behind


def interrupted_after(entries, count):
    """``entries``, stopped by a KeyboardInterrupt after ``count`` of them."""
    for position, entry in enumerate(entries):
        if position == count:
            raise KeyboardInterrupt
        yield entry


def test_interrupted_conversion_resumes(tmp_path, fixtures):
    entries, sources = readers(fixtures)["bottom-up-tsv"]
    output = tmp_path / "out.h5"
    with pytest.raises(KeyboardInterrupt):
        convert(interrupted_after(entries, 2), output, sources, feature_dim=DIM, progress=False)
    assert not output.exists()
    with pytest.raises(RegionFeatureError, match=r"out\.h5\.partial: not marked complete.*with 2 images so far"):
        RegionFeatureStore(layout.partial_path(output))
    entries, sources = readers(fixtures)["bottom-up-tsv"]
    counts = convert(entries, output, sources, feature_dim=DIM, progress=False)
    assert counts == {"written": 2, "skipped": 2, "images": 4, "unchanged": False}
    store = RegionFeatureStore(output)
    assert store.image_ids == IDS
    assert_same(store[IDS[3]], expected(IDS[3]))
    entries, sources = readers(fixtures)["bottom-up-tsv"]
    assert convert(entries, output, sources, feature_dim=DIM, progress=False) == {
        "written": 0, "skipped": 4, "images": 4, "unchanged": True}


def _rewrite(source, path, edit):
    """``source``'s lines, with ``edit(fields_of_each_line)`` applied, written to ``path``."""
    lines = [line.split("\t") for line in source.read_text().splitlines()]
    edit(lines)
    path.write_text("".join("\t".join(fields) + "\n" for fields in lines))
    return path


def test_skipped_records_are_not_decoded(tmp_path, fixtures):
    def corrupt(lines):
        lines[1][5] = "!!! not base64 !!!"
    path = _rewrite(fixtures["bottom-up-tsv"], tmp_path / "broken.tsv", corrupt)
    entries = list(bottom_up_tsv.entries(path))
    assert [entry.image_id for entry in entries] == IDS
    assert [item.image_id for item in load(entries[:1] + entries[2:])] == [IDS[0]] + IDS[2:]
    with pytest.raises(RegionFeatureError, match=r"broken\.tsv, line 2 \(image id 7\): field 'features' is not "
                                                 r"valid base64 .*the row is truncated or corrupt"):
        entries[1].load()


def test_another_feature_dimension_in_the_first_record_suggests_the_option(tmp_path, fixtures):
    entries, sources = readers(fixtures, feature_dim=2048)["mcan-npz"]
    with pytest.raises(RegionFeatureError, match=r"000000000001\.jpg\.npz \(image id 1\): field 'x' holds \d+ x 16 "
                                                 r"values, expected \d+ x 2048 .*; if this input holds 16-d features, "
                                                 r"convert it with --feature-dim 16 into a new --output"):
        convert(entries, tmp_path / "out.h5", sources, feature_dim=2048, progress=False)
    assert list(tmp_path.iterdir()) == []  # failed at the first image: no output, no partial file
    entries, _ = readers(fixtures, feature_dim=2048)["bottom-up-tsv"]
    with pytest.raises(RegionFeatureError, match=r"line 1 \(image id 42\): field 'features' holds \d+ x 16 values, "
                                                 r"expected .*--feature-dim 16 into a new --output"):
        next(entries).load()


def _truncate_features(lines, line, keep_bytes):
    """Cut the base64 'features' field of ``line`` (1-based) to the base64 of its first ``keep_bytes`` bytes."""
    fields = lines[line - 1]
    fields[5] = base64.b64encode(base64.b64decode(fields[5])[:keep_bytes]).decode()


def test_truncated_features_are_named_as_such_not_as_another_dimension(tmp_path, fixtures):
    """A row cut so that it still holds whole rows of a shorter feature is a truncated row past line 1."""
    count = expected(IDS[2]).num_regions
    path = _rewrite(fixtures["bottom-up-tsv"], tmp_path / "cut.tsv",
                    lambda lines: _truncate_features(lines, 3, count * 5 * 4))
    entries = list(bottom_up_tsv.entries(path, feature_dim=DIM))
    with pytest.raises(RegionFeatureError) as info:
        entries[2].load()
    message = str(info.value)
    assert re.search(rf"cut\.tsv, line 3 \(image id 273052\): field 'features' holds {count} x 5 values, expected "
                     rf"{count} x 16 .*, as the records before it; the row is truncated or corrupt$", message)
    assert "--feature-dim 5" not in message


def test_a_byte_count_that_is_not_whole_floats_is_a_clear_error(tmp_path, fixtures):
    path = _rewrite(fixtures["bottom-up-tsv"], tmp_path / "cut.tsv", lambda lines: _truncate_features(lines, 2, 30))
    with pytest.raises(RegionFeatureError, match=r"cut\.tsv, line 2 \(image id 7\): field 'features' decodes to 30 "
                                                 r"bytes, not a whole number of 4-byte float32 values; the row is "
                                                 r"truncated or corrupt"):
        list(load(bottom_up_tsv.entries(path, feature_dim=DIM)))
    path = _rewrite(fixtures["bottom-up-tsv"], tmp_path / "cut.tsv", lambda lines: _truncate_features(lines, 2, 28))
    with pytest.raises(RegionFeatureError, match=r"line 2 \(image id 7\): field 'features' holds 7 float32 values, "
                                                 r"not \d+ rows \(num_boxes\) of equal width; the row is truncated"):
        list(load(bottom_up_tsv.entries(path, feature_dim=DIM)))


def test_a_bad_row_midway_publishes_nothing_and_keeps_the_work(tmp_path, fixtures):
    def corrupt(lines):
        lines[2][4] = lines[2][4][:-8]  # line 3: boxes cut short
    path = _rewrite(fixtures["bottom-up-tsv"], tmp_path / "bad.tsv", corrupt)
    output = tmp_path / "out.h5"
    with pytest.raises(RegionFeatureError, match=r"bad\.tsv, line 3 \(image id 273052\): field 'boxes' .*\n.*"
                                                 r"out\.h5\.partial keeps the 2 images written so far\. A re-run "
                                                 r"resumes it only while the inputs are unchanged: once you have fixed "
                                                 r"the input, re-run the command with --overwrite \(or delete it and "
                                                 r"re-run\)"):
        convert(bottom_up_tsv.entries(path, DIM), output, [bottom_up_tsv.source(path)], feature_dim=DIM,
                progress=False)
    assert not output.exists()
    with pytest.raises(RegionFeatureError, match="not marked complete"):
        RegionFeatureStore(layout.partial_path(output))
    fixed = fixtures["bottom-up-tsv"].read_bytes()
    path.write_bytes(fixed)  # the input fetched again: another size, so the partial file is not resumed silently
    with pytest.raises(RegionFeatureError, match=r"an unfinished conversion with other inputs or options .*start "
                                                 r"over with --overwrite"):
        convert(bottom_up_tsv.entries(path, DIM), output, [bottom_up_tsv.source(path)], feature_dim=DIM,
                progress=False)
    assert convert(bottom_up_tsv.entries(path, DIM), output, [bottom_up_tsv.source(path)], feature_dim=DIM,
                   progress=False, overwrite=True)["written"] == 4
    assert RegionFeatureStore(output).image_ids == IDS


@pytest.mark.parametrize("module, what", [(bottom_up_tsv, "a bottom-up TSV file"),
                                          (lxmert_tsv, "an LXMERT \\*_obj36\\.tsv file")])
def test_empty_missing_or_folder_inputs_are_clean_errors(tmp_path, module, what):
    (tmp_path / "empty.tsv").write_bytes(b"")
    with pytest.raises(RegionFeatureError, match=rf"empty\.tsv: the file is empty \(0 bytes\), expected {what}; "
                                                 rf"the download or copy failed"):
        module.source(tmp_path / "empty.tsv")
    with pytest.raises(RegionFeatureError, match=rf"nowhere\.tsv: no such file \({what}\)"):
        module.source(tmp_path / "nowhere.tsv")
    with pytest.raises(RegionFeatureError, match=rf"{tmp_path.name}: is a directory, expected {what}; to convert the "
                                                 rf"files in it, pass them"):
        module.source(tmp_path)
    (tmp_path / "blank.tsv").write_text("\n\n")
    module.source(tmp_path / "blank.tsv")
    with pytest.raises(RegionFeatureError, match=r"blank\.tsv: no rows \(the file holds only blank lines\)"):
        convert(module.entries(tmp_path / "blank.tsv"), tmp_path / "out.h5", [module.source(tmp_path / "blank.tsv")],
                feature_dim=DIM, progress=False)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["blank.tsv", "empty.tsv"]


def test_duplicate_ids_name_both_places(tmp_path, fixtures):
    def repeat(lines):
        lines.append(lines[1])
    path = _rewrite(fixtures["bottom-up-tsv"], tmp_path / "twice.tsv", repeat)
    output = tmp_path / "out.h5"
    with pytest.raises(RegionFeatureError, match=r"image id 7 appears twice, at .*twice\.tsv, line 2 and at "
                                                 r".*twice\.tsv, line 5"):
        convert(bottom_up_tsv.entries(path, DIM), output, [bottom_up_tsv.source(path)], feature_dim=DIM,
                progress=False)
    other = _rewrite(fixtures["bottom-up-tsv"], tmp_path / "other.tsv", lambda lines: lines.pop(0))
    inputs = [fixtures["bottom-up-tsv"], other]
    with pytest.raises(RegionFeatureError, match=r"image id 7 appears twice, at .*bottom_up\.tsv, line 2 and at "
                                                 r".*other\.tsv, line 1"):
        convert((e for p in inputs for e in bottom_up_tsv.entries(p, DIM)), tmp_path / "two.h5",
                [bottom_up_tsv.source(p) for p in inputs], feature_dim=DIM, progress=False)


def test_a_duplicate_is_found_after_a_resume(tmp_path, fixtures):
    """Line 5 repeats line 2, and the run stopped after line 3: the re-run still sees both places."""
    path = _rewrite(fixtures["bottom-up-tsv"], tmp_path / "twice.tsv", lambda lines: lines.append(lines[1]))
    output = tmp_path / "out.h5"
    with pytest.raises(KeyboardInterrupt):
        convert(interrupted_after(bottom_up_tsv.entries(path, DIM), 3), output, [bottom_up_tsv.source(path)],
                feature_dim=DIM, progress=False)
    with pytest.raises(RegionFeatureError, match=r"image id 7 appears twice, at .*twice\.tsv, line 2 and at "
                                                 r".*twice\.tsv, line 5"):
        convert(bottom_up_tsv.entries(path, DIM), output, [bottom_up_tsv.source(path)], feature_dim=DIM,
                progress=False)


def test_duplicate_ids_across_mcan_folders_name_both_files(tmp_path):
    mcan_npz.write(tmp_path / "train2014", [expected(1), expected(9)], split="train2014")
    mcan_npz.write(tmp_path / "val2014", [expected(9)], split="val2014")
    folders = [tmp_path / "train2014", tmp_path / "val2014"]
    with pytest.raises(RegionFeatureError, match=r"image 'COCO_val2014_000000000009' \(id 9\) appears twice, at "
                                                 r".*train2014/COCO_train2014_000000000009\.jpg\.npz and at "
                                                 r".*val2014/COCO_val2014_000000000009\.jpg\.npz"):
        convert((e for folder in folders for e in mcan_npz.entries(folder, DIM)), tmp_path / "out.h5",
                [mcan_npz.source(folder) for folder in folders], feature_dim=DIM, progress=False)


def test_lxmert_names_are_kept_whole(tmp_path):
    """NLVR2's names end in the same digits; each is its own image, found by its name."""
    names = ["train-10171-0-img0", "train-10171-1-img0", "train-10171-0-img1", "COCO_val2014_000000273052"]
    items = [replace(expected(numeric_id(name)), name=name) for name in names]
    path = lxmert_tsv.write(tmp_path / "nlvr2_obj36.tsv", items)
    counts = convert(lxmert_tsv.entries(path, DIM), tmp_path / "out.h5", [lxmert_tsv.source(path)],
                     feature_dim=DIM, progress=False)
    assert counts["images"] == 4
    store = RegionFeatureStore(tmp_path / "out.h5")
    assert store.image_names == names and len(set(store.image_ids)) == 4
    for item in items:
        assert store[item.name].name == item.name
        assert_same(store[item.name], item)
    assert_same(store[273052], items[3])


# --- the fixtures are faithful: the projects' own loaders read them (transcribed, shortened) ---

def test_anderson_read_tsv_reads_the_fixture(fixtures):
    """bottom-up-attention tools/read_tsv.py."""
    csv.field_size_limit(sys.maxsize)
    names = ["image_id", "image_w", "image_h", "num_boxes", "boxes", "features"]
    with open(fixtures["bottom-up-tsv"]) as tsv:
        for item in csv.DictReader(tsv, delimiter="\t", fieldnames=names):
            for field in ("image_id", "image_h", "image_w", "num_boxes"):
                item[field] = int(item[field])
            for field in ("boxes", "features"):
                item[field] = np.frombuffer(base64.b64decode(item[field]), dtype=np.float32).reshape(
                    (item["num_boxes"], -1))
            want = expected(item["image_id"])
            assert (item["image_h"], item["image_w"]) == want.image_size
            np.testing.assert_array_equal(item["features"], want.features.numpy())
            np.testing.assert_array_equal(item["boxes"], want.boxes.numpy())


def test_lxmert_load_obj_tsv_reads_the_fixture(fixtures):
    """lxmert src/utils.py load_obj_tsv."""
    names = ["img_id", "img_h", "img_w", "objects_id", "objects_conf", "attrs_id", "attrs_conf", "num_boxes",
             "boxes", "features"]
    with open(fixtures["lxmert-tsv"]) as f:
        for item in csv.DictReader(f, names, delimiter="\t"):
            for key in ["img_h", "img_w", "num_boxes"]:
                item[key] = int(item[key])
            boxes = item["num_boxes"]
            decode_config = [("objects_id", (boxes,), np.int64), ("objects_conf", (boxes,), np.float32),
                             ("attrs_id", (boxes,), np.int64), ("attrs_conf", (boxes,), np.float32),
                             ("boxes", (boxes, 4), np.float32), ("features", (boxes, -1), np.float32)]
            for key, shape, dtype in decode_config:
                item[key] = np.frombuffer(base64.b64decode(item[key]), dtype=dtype).reshape(shape)
            assert item["img_id"].startswith("COCO_val2014_")
            want = expected(int(item["img_id"][-12:]))
            np.testing.assert_array_equal(item["features"], want.features.numpy())
            assert item["objects_id"].max() < 1600 and item["attrs_id"].max() < 400


def test_mcan_proc_img_feat_reads_the_fixture(fixtures):
    """mcan-vqa core/data/load_data.py: np.load(path)['x'].transpose((1, 0)), zero-padded to 100."""
    path = fixtures["mcan-npz"] / "COCO_val2014_000000273052.jpg.npz"
    img_feat = np.load(path)["x"].transpose((1, 0))
    want = expected(273052)
    np.testing.assert_array_equal(img_feat, want.features.numpy())
    assert np.load(path)["bbox"].shape == (want.num_regions, 4)


def test_selfcritical_files_match_make_bu_data(fixtures):
    root = fixtures["selfcritical-npz"]
    want = expected(7)
    np.testing.assert_array_equal(np.load(root / "cocobu_att" / "7.npz")["feat"], want.features.numpy())
    np.testing.assert_allclose(np.load(root / "cocobu_fc" / "7.npy"), want.features.numpy().mean(0))
    np.testing.assert_array_equal(np.load(root / "cocobu_box" / "7.npy"), want.boxes.numpy())


# --- bad input: errors name the file, the record and the fix ---

def test_truncated_tsv_line_names_file_and_line(tmp_path, fixtures):
    text = fixtures["lxmert-tsv"].read_text()
    path = tmp_path / "cut_obj36.tsv"
    path.write_text(text[: text.index("\n") + 200])  # second line cut inside its 'objects_id' field
    entries = lxmert_tsv.entries(path)
    assert next(entries).load().image_id == IDS[0]
    with pytest.raises(RegionFeatureError, match=r"cut_obj36\.tsv, line 2: expected the 10 tab-separated fields"):
        next(entries)


def test_tsv_box_count_mismatch_is_reported(tmp_path, fixtures):
    fields = fixtures["bottom-up-tsv"].read_text().splitlines()[0].split("\t")
    fields[3] = str(int(fields[3]) + 1)
    path = tmp_path / "bad.tsv"
    path.write_text("\t".join(fields) + "\n")
    with pytest.raises(RegionFeatureError, match=r"bad\.tsv, line 1 \(image id 42\): field 'boxes' holds \d+ "
                                                 r"float32 values, expected num_boxes x 4 = \d+; the row is truncated"):
        load(bottom_up_tsv.entries(path))


def test_lxmert_empty_id(tmp_path, fixtures):
    fields = fixtures["lxmert-tsv"].read_text().splitlines()[0].split("\t")
    fields[0] = " "
    path = tmp_path / "x_obj36.tsv"
    path.write_text("\t".join(fields) + "\n")
    with pytest.raises(RegionFeatureError, match=r"x_obj36\.tsv, line 1: field 'img_id' is empty"):
        list(lxmert_tsv.entries(path))


def test_mcan_npz_missing_key_and_truncated_file(tmp_path):
    directory = tmp_path / "val2014"
    directory.mkdir()
    np.savez(directory / "COCO_val2014_000000000005.jpg.npz", x=np.zeros((DIM, 3)))
    with pytest.raises(RegionFeatureError, match=r"COCO_val2014_000000000005\.jpg\.npz: key\(s\) \['bbox', 'image_h', "
                                                 r"'image_w'\] missing"):
        load(mcan_npz.entries(directory))
    np.savez(directory / "COCO_val2014_000000000005.jpg.npz", x=np.zeros((3, DIM)), bbox=np.zeros((3, 4)),
             image_h=480, image_w=640)
    with pytest.raises(RegionFeatureError, match=r"field 'x' has shape \(3, 16\), expected \[D, N\] with N = 3 boxes"):
        load(mcan_npz.entries(directory))
    mcan_npz.write(directory, [expected(5)])
    path = directory / "COCO_val2014_000000000005.jpg.npz"
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(RegionFeatureError, match=r"000000000005\.jpg\.npz: cannot read the \.npz .*truncated"):
        load(mcan_npz.entries(directory))


def test_selfcritical_needs_boxes_and_sizes(tmp_path):
    root = selfcritical_npz.write(tmp_path / "sc", [expected(3), expected(4)])
    with pytest.raises(RegionFeatureError, match=r"4\.npz \(image id 4\): no image size"):
        load(selfcritical_npz.entries(root / "cocobu_att", root / "cocobu_box", {3: (480, 640)}))
    (root / "cocobu_box" / "4.npy").unlink()
    sizes = selfcritical_npz.load_image_sizes(root / "image_info.json")
    with pytest.raises(RegionFeatureError, match=r"image id 4\): its boxes .*4\.npy are missing"):
        load(selfcritical_npz.entries(root / "cocobu_att", root / "cocobu_box", sizes))
    bad = tmp_path / "info.json"
    bad.write_text('{"images": [{"id": 3, "file_name": "x.jpg"}]}')
    with pytest.raises(RegionFeatureError, match=r"info\.json: images\[0\] needs 'id' \(or 'cocoid'\), 'width' and "
                                                 r"'height'"):
        selfcritical_npz.load_image_sizes(bad)
