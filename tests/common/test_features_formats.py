"""common.features.formats and convert: every input format round-trips into the HDF5 store."""
import base64
import csv
import sys

import numpy as np
import pytest
import torch

from common.features import RegionFeatureError, RegionFeatureStore
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


def readers(paths):
    sizes = selfcritical_npz.load_image_sizes(paths["selfcritical-npz"] / "image_info.json")
    return {
        "bottom-up-tsv": lambda skip: bottom_up_tsv.read(paths["bottom-up-tsv"], skip=skip),
        "lxmert-tsv": lambda skip: lxmert_tsv.read(paths["lxmert-tsv"], skip=skip),
        "selfcritical-npz": lambda skip: selfcritical_npz.read(paths["selfcritical-npz"] / "cocobu_att",
                                                               paths["selfcritical-npz"] / "cocobu_box", sizes,
                                                               skip=skip),
        "mcan-npz": lambda skip: mcan_npz.read(paths["mcan-npz"], skip=skip),
    }


FORMATS = ("bottom-up-tsv", "lxmert-tsv", "selfcritical-npz", "mcan-npz")


def assert_same(got, want):
    assert got.image_id == want.image_id and got.image_size == want.image_size
    assert torch.equal(got.features, want.features) and torch.equal(got.boxes, want.boxes)


@pytest.mark.parametrize("name", FORMATS)
def test_reader_returns_what_the_fixture_wrote(fixtures, name):
    items = list(readers(fixtures)[name](lambda image_id: False))
    # TSVs keep the written order; the per-image directories are read by image id
    order = IDS if name.endswith("tsv") else sorted(IDS)
    assert [item.image_id for item in items] == order
    for item in items:
        assert_same(item, expected(item.image_id))


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_convert_round_trips(tmp_path, fixtures, name, dtype):
    counts = convert(readers(fixtures)[name], tmp_path / "out.h5", feature_dim=DIM, dtype=dtype, progress=False)
    assert counts == {"written": 4, "skipped": 0, "images": 4}
    store = RegionFeatureStore(tmp_path / "out.h5")
    assert sorted(store.image_ids) == sorted(IDS)
    for image_id in IDS:
        assert_same(store[image_id], expected(image_id))


def test_interrupted_conversion_resumes(tmp_path, fixtures):
    read = readers(fixtures)["bottom-up-tsv"]

    def dies_after_two(skip):
        for position, item in enumerate(read(skip)):
            if position == 2:
                raise KeyboardInterrupt
            yield item

    with pytest.raises(KeyboardInterrupt):
        convert(dies_after_two, tmp_path / "out.h5", feature_dim=DIM, progress=False)
    assert RegionFeatureStore(tmp_path / "out.h5").image_ids == IDS[:2]
    counts = convert(read, tmp_path / "out.h5", feature_dim=DIM, progress=False)
    assert counts == {"written": 2, "skipped": 2, "images": 4}
    store = RegionFeatureStore(tmp_path / "out.h5")
    assert store.image_ids == IDS
    assert_same(store[IDS[3]], expected(IDS[3]))


def test_skipped_records_are_not_decoded(tmp_path, fixtures):
    lines = fixtures["bottom-up-tsv"].read_text().splitlines()
    fields = lines[1].split("\t")
    fields[5] = "!!! not base64 !!!"
    path = tmp_path / "broken.tsv"
    path.write_text("\n".join([lines[0], "\t".join(fields)] + lines[2:]) + "\n")
    items = list(bottom_up_tsv.read(path, skip=lambda image_id: image_id == IDS[1]))
    assert [item.image_id for item in items] == [IDS[0]] + IDS[2:]
    with pytest.raises(RegionFeatureError, match=r"broken\.tsv, line 2 \(image id 7\): field 'features' is not "
                                                 r"valid base64"):
        list(bottom_up_tsv.read(path))


def test_convert_rejects_another_feature_dimension(tmp_path, fixtures):
    with pytest.raises(RegionFeatureError,
                       match=r"image id 1: 16-d features, but .*out\.h5 holds 2048-d ones; pass --feature-dim 16"):
        convert(readers(fixtures)["mcan-npz"], tmp_path / "out.h5", feature_dim=2048, progress=False)


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
    items = lxmert_tsv.read(path)
    assert next(items).image_id == IDS[0]
    with pytest.raises(RegionFeatureError, match=r"cut_obj36\.tsv, line 2: expected the 10 tab-separated fields"):
        next(items)


def test_tsv_box_count_mismatch_is_reported(tmp_path, fixtures):
    fields = fixtures["bottom-up-tsv"].read_text().splitlines()[0].split("\t")
    fields[3] = str(int(fields[3]) + 1)
    path = tmp_path / "bad.tsv"
    path.write_text("\t".join(fields) + "\n")
    with pytest.raises(RegionFeatureError, match=r"bad\.tsv, line 1 \(image id 42\): field 'boxes' holds \d+ "
                                                 r"float32 values, which do not form shape"):
        list(bottom_up_tsv.read(path))


def test_lxmert_id_without_digits(tmp_path, fixtures):
    fields = fixtures["lxmert-tsv"].read_text().splitlines()[0].split("\t")
    fields[0] = "COCO_val2014_x"
    path = tmp_path / "x_obj36.tsv"
    path.write_text("\t".join(fields) + "\n")
    with pytest.raises(RegionFeatureError, match=r"line 1: field 'img_id' is 'COCO_val2014_x'"):
        list(lxmert_tsv.read(path))


def test_mcan_npz_missing_key_and_truncated_file(tmp_path):
    directory = tmp_path / "val2014"
    directory.mkdir()
    np.savez(directory / "COCO_val2014_000000000005.jpg.npz", x=np.zeros((DIM, 3)))
    with pytest.raises(RegionFeatureError, match=r"COCO_val2014_000000000005\.jpg\.npz: key\(s\) \['bbox', 'image_h', "
                                                 r"'image_w'\] missing"):
        list(mcan_npz.read(directory))
    np.savez(directory / "COCO_val2014_000000000005.jpg.npz", x=np.zeros((3, DIM)), bbox=np.zeros((3, 4)),
             image_h=480, image_w=640)
    with pytest.raises(RegionFeatureError, match=r"key 'x' has shape \(3, 16\), expected \[D, N\] with N = 3 boxes"):
        list(mcan_npz.read(directory))
    mcan_npz.write(directory, [expected(5)])
    path = directory / "COCO_val2014_000000000005.jpg.npz"
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(RegionFeatureError, match=r"000000000005\.jpg\.npz: cannot read the \.npz .*truncated"):
        list(mcan_npz.read(directory))


def test_selfcritical_needs_boxes_and_sizes(tmp_path):
    root = selfcritical_npz.write(tmp_path / "sc", [expected(3), expected(4)])
    with pytest.raises(RegionFeatureError, match=r"4\.npz \(image id 4\): no image size"):
        list(selfcritical_npz.read(root / "cocobu_att", root / "cocobu_box", {3: (480, 640)}))
    (root / "cocobu_box" / "4.npy").unlink()
    sizes = selfcritical_npz.load_image_sizes(root / "image_info.json")
    with pytest.raises(RegionFeatureError, match=r"image id 4\): its boxes .*4\.npy are missing"):
        list(selfcritical_npz.read(root / "cocobu_att", root / "cocobu_box", sizes))
    bad = tmp_path / "info.json"
    bad.write_text('{"images": [{"id": 3, "file_name": "x.jpg"}]}')
    with pytest.raises(RegionFeatureError, match=r"info\.json: images\[0\] needs 'id' \(or 'cocoid'\), 'width' and "
                                                 r"'height'"):
        selfcritical_npz.load_image_sizes(bad)
