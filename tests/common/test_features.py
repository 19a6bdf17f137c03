"""common.features: the HDF5 region-feature store, writer (published whole, resumable), names, padding, fixtures."""
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from common.features import (MissingImageError, RegionFeatureError, RegionFeatures, RegionFeatureStore,
                             RegionFeatureWriter, numeric_id, pad_regions)
from common.features import layout
from common.features.fixtures import random_region_features, write_random_features
from common.features.writer import mark_complete

DIM = 16
ROOT = Path(__file__).resolve().parents[2]


def _assert_same(got: RegionFeatures, want: RegionFeatures):
    assert got.image_id == want.image_id
    assert got.image_size == want.image_size
    assert got.features.dtype == torch.float32 and got.boxes.dtype == torch.float32
    torch.testing.assert_close(got.features, want.features, rtol=0, atol=0)
    torch.testing.assert_close(got.boxes, want.boxes, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_round_trip_ragged(tmp_path, dtype):
    ids = [9, 3, 1000000000042, 7]
    path = write_random_features(tmp_path / "f.h5", ids, num_regions=(10, 100), feature_dim=DIM, dtype=dtype,
                                 image_size=(300, 200))
    store = RegionFeatureStore(path)
    assert len(store) == 4 and store.image_ids == ids and store.feature_dim == DIM
    assert 3 in store and 4 not in store
    counts = set()
    for image_id in reversed(ids):
        want = random_region_features(image_id, (10, 100), DIM, image_size=(300, 200))
        _assert_same(store[image_id], want)
        assert store.num_regions(image_id) == want.num_regions
        counts.add(want.num_regions)
    assert len(counts) > 1  # really ragged


def test_store_can_return_the_stored_float16(tmp_path):
    path = write_random_features(tmp_path / "f.h5", [4], feature_dim=DIM)
    half = RegionFeatureStore(path, dtype=torch.float16)[4]
    assert half.features.dtype == torch.float16
    assert torch.equal(half.features.float(), random_region_features(4, 36, DIM).features)
    features, _, mask = pad_regions([half, random_region_features(5, 2, DIM)])
    assert features.dtype == torch.float16 and mask.sum().item() == 38


def test_fixture_is_deterministic_per_image_and_valid():
    a = random_region_features(5, 36, DIM, seed=1)
    b = random_region_features(5, 36, DIM, seed=1)
    c = random_region_features(6, 36, DIM, seed=1)
    assert torch.equal(a.features, b.features) and not torch.equal(a.features, c.features)
    assert (a.features >= 0).all() and a.num_regions == 36
    x1, y1, x2, y2 = a.boxes.unbind(1)
    assert (x1 >= 0).all() and (x2 > x1).all() and (x2 <= 640).all() and (y2 > y1).all() and (y2 <= 480).all()


def test_missing_image_names_file_and_id(tmp_path):
    path = write_random_features(tmp_path / "f.h5", [1, 2], feature_dim=DIM)
    store = RegionFeatureStore(path)
    with pytest.raises(MissingImageError, match=r"f\.h5: no features for image id 77") as info:
        store[77]
    assert isinstance(info.value, KeyError)


def test_appending_to_a_file_being_read_leaves_the_reader_on_the_old_file(tmp_path):
    """The writer builds <path>.partial and renames it: a store reading <path> is not disturbed."""
    path = write_random_features(tmp_path / "f.h5", [1], feature_dim=DIM)
    with RegionFeatureStore(path) as store:
        store[1]
        with RegionFeatureWriter(path, feature_dim=DIM, append=True) as writer:
            item = random_region_features(2, 36, DIM)
            writer.add(2, item.features, item.boxes, 480, 640)
        assert store.image_ids == [1] and 2 not in store
        _assert_same(store[1], random_region_features(1, 36, DIM))
    assert RegionFeatureStore(path).image_ids == [1, 2]


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(RegionFeatureError, match=r"nope\.h5: no such region-feature file.*convert_features"):
        RegionFeatureStore(tmp_path / "nope.h5")


def test_pad_regions_masks_and_zero_padding():
    items = [random_region_features(i, n, DIM) for i, n in ((1, 3), (2, 5), (3, 1))]
    features, boxes, mask = pad_regions(items)
    assert features.shape == (3, 5, DIM) and boxes.shape == (3, 5, 4) and mask.dtype == torch.bool
    assert mask.sum(1).tolist() == [3, 5, 1]
    for i, item in enumerate(items):
        n = item.num_regions
        assert torch.equal(features[i, :n], item.features) and torch.equal(boxes[i, :n], item.boxes)
        assert (features[i, n:] == 0).all() and (boxes[i, n:] == 0).all()


def test_pad_regions_to_a_fixed_length_truncates_longer_images():
    items = [random_region_features(1, 6, DIM), random_region_features(2, 2, DIM)]
    features, boxes, mask = pad_regions(items, max_regions=4)
    assert features.shape == (2, 4, DIM)
    assert mask.tolist() == [[True] * 4, [True, True, False, False]]
    assert torch.equal(features[0], items[0].features[:4]) and torch.equal(boxes[0], items[0].boxes[:4])


def test_pad_regions_rejects_mixed_dimensions():
    with pytest.raises(ValueError, match="feature dimensions differ"):
        pad_regions([random_region_features(1, 2, DIM), random_region_features(2, 2, DIM + 1)])


def test_existing_file_is_refused_without_append_and_extended_with_it(tmp_path):
    path = write_random_features(tmp_path / "f.h5", [1, 2], feature_dim=DIM)
    before = path.read_bytes()
    with pytest.raises(RegionFeatureError, match=r"f\.h5 already exists \(2 images from no recorded inputs\); "
                                                 r"pass --append"):
        RegionFeatureWriter(path, feature_dim=DIM).open()
    assert path.read_bytes() == before and not layout.partial_path(path).exists()
    with RegionFeatureWriter(path, feature_dim=DIM, append=True) as writer:
        assert 1 in writer and 2 in writer and len(writer) == 2
        with pytest.raises(RegionFeatureError, match="image id 2 is already stored"):
            item = random_region_features(2, 36, DIM)
            writer.add(2, item.features, item.boxes, 480, 640)
        item = random_region_features(3, 36, DIM)
        writer.add(3, item.features, item.boxes, 480, 640)
        assert path.read_bytes() == before  # the published file is untouched until the writer closes
    store = RegionFeatureStore(path)
    assert store.image_ids == [1, 2, 3]
    for i in (1, 2, 3):
        _assert_same(store[i], random_region_features(i, 36, DIM))


def _add(writer, image_id, origin=""):
    item = random_region_features(image_id, 36, DIM)
    writer.add(image_id, item.features, item.boxes, 480, 640, origin=origin)


def _interrupted(path, ids, sources=()):
    """A writer of ``ids`` stopped by an exception: its partial file is left for a resume."""
    with pytest.raises(KeyboardInterrupt):
        with RegionFeatureWriter(path, feature_dim=DIM, sources=sources) as writer:
            for image_id in ids:
                _add(writer, image_id, origin=f"in, line {image_id}")
            raise KeyboardInterrupt
    return layout.partial_path(path)


def test_interrupted_writer_publishes_nothing_and_resumes(tmp_path):
    path = tmp_path / "f.h5"
    partial = _interrupted(path, [1, 2])
    assert partial.exists() and not path.exists()
    with pytest.raises(RegionFeatureError, match=r"f\.h5: not written yet: .*stopped before the end .*f\.h5\.partial; "
                                                 r"re-run the same command to resume"):
        RegionFeatureStore(path)
    with pytest.raises(RegionFeatureError, match=r"f\.h5\.partial: not marked complete: .* with 2 images so far\. "
                                                 r"Re-run the same command to resume; it publishes .*f\.h5 when done"):
        RegionFeatureStore(partial)
    with RegionFeatureWriter(path, feature_dim=DIM) as writer:
        assert writer.already_stored(2, "in, line 2") and not writer.already_stored(3, "in, line 3")
        _add(writer, 3, "in, line 3")
    assert not partial.exists()
    store = RegionFeatureStore(path)
    assert store.image_ids == [1, 2, 3]
    _assert_same(store[2], random_region_features(2, 36, DIM))


def test_a_failed_start_leaves_no_file(tmp_path):
    (tmp_path / "f.h5.partial.new").write_bytes(b"left by a run killed while building its work file")
    with pytest.raises(RegionFeatureError, match="bad input"):
        with RegionFeatureWriter(tmp_path / "f.h5", feature_dim=DIM):
            raise RegionFeatureError("bad input")
    assert list(tmp_path.iterdir()) == []


def test_an_error_says_where_the_work_so_far_is(tmp_path):
    with pytest.raises(RegionFeatureError, match=r"bad input\n.*f\.h5\.partial keeps the 1 images written so far\. "
                                                 r"A re-run resumes it only while the inputs are unchanged"):
        with RegionFeatureWriter(tmp_path / "f.h5", feature_dim=DIM) as writer:
            _add(writer, 1)
            raise RegionFeatureError("bad input")


def test_resuming_with_other_inputs_is_refused(tmp_path):
    path = tmp_path / "f.h5"
    _interrupted(path, [1], sources=[{"path": "/data/a.tsv", "format": "bottom-up-tsv", "bytes": 10}])
    other = [{"path": "/data/a.tsv", "format": "bottom-up-tsv", "bytes": 12}]
    with pytest.raises(RegionFeatureError, match=r"f\.h5\.partial: an unfinished conversion with other inputs or "
                                                 r"options \(it reads /data/a\.tsv \(10 bytes\), this command "
                                                 r"/data/a\.tsv \(12 bytes\)\)\. .*start over with --overwrite \(or "
                                                 r"by deleting .*f\.h5\.partial\)"):
        RegionFeatureWriter(path, feature_dim=DIM, sources=other).open()
    with RegionFeatureWriter(path, feature_dim=DIM, sources=other, overwrite=True) as writer:
        assert len(writer) == 0  # a rebuild starts over
        _add(writer, 2)
    assert RegionFeatureStore(path).sources == other and RegionFeatureStore(path).image_ids == [2]


def test_an_id_from_two_places_is_an_error_naming_both(tmp_path):
    with RegionFeatureWriter(tmp_path / "f.h5", feature_dim=DIM) as writer:
        _add(writer, 7, origin="a.tsv, line 3")
        assert writer.already_stored(7, "a.tsv, line 3")
        with pytest.raises(RegionFeatureError, match=r"image id 7 appears twice, at a\.tsv, line 3 and at b\.tsv, "
                                                     r"line 9; .*one of them would be lost"):
            writer.already_stored(7, "b.tsv, line 9")
        with pytest.raises(RegionFeatureError, match=r"image id 7 \(b\.tsv, line 9\) is already stored \(from "
                                                     r"a\.tsv, line 3\)"):
            _add(writer, 7, origin="b.tsv, line 9")
        with pytest.raises(RegionFeatureError, match=r"a\.tsv, line 3 holds image id 8, but image id 7 was stored "
                                                     r"from there: the input changed since it was read"):
            writer.already_stored(8, "a.tsv, line 3")


def test_overwrite_rebuilds_a_store_that_stays_whole_until_replaced(tmp_path):
    path = write_random_features(tmp_path / "f.h5", [1, 2], feature_dim=DIM)
    before = path.read_bytes()
    assert RegionFeatureStore(path).options == {"dtype": "float16", "feature_dim": DIM}
    with RegionFeatureWriter(path, feature_dim=DIM, dtype="float32", overwrite=True) as writer:
        assert len(writer) == 0
        _add(writer, 3)
        writer.flush()
        assert path.read_bytes() == before and RegionFeatureStore(path).image_ids == [1, 2]
    store = RegionFeatureStore(path)
    assert store.image_ids == [3] and store.options == {"dtype": "float32", "feature_dim": DIM}
    _assert_same(store[3], random_region_features(3, 36, DIM))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.h5"]
    with pytest.raises(KeyboardInterrupt):  # a rebuild interrupted: the old store stays, the next run resumes it
        with RegionFeatureWriter(path, feature_dim=DIM, overwrite=True) as writer:
            _add(writer, 4)
            raise KeyboardInterrupt
    assert RegionFeatureStore(path).image_ids == [3]
    with pytest.raises(RegionFeatureError, match=r"f\.h5\.partial holds an interrupted append or rebuild: re-run "
                                                 r"that command \(with --append or --overwrite\)"):
        RegionFeatureWriter(path, feature_dim=DIM).open()
    with RegionFeatureWriter(path, feature_dim=DIM, overwrite=True) as writer:
        assert 4 in writer and len(writer) == 1
    assert RegionFeatureStore(path).image_ids == [4]
    with pytest.raises(ValueError, match="exclude each other"):
        RegionFeatureWriter(path, append=True, overwrite=True)
    (tmp_path / "other.h5").write_bytes(before)
    with h5py.File(tmp_path / "other.h5", "a") as file:
        file.attrs["format"] = "something else"
    with pytest.raises(RegionFeatureError, match=r"other\.h5: an HDF5 file that is not a region-feature file"):
        RegionFeatureWriter(tmp_path / "other.h5", feature_dim=DIM, overwrite=True).open()


def test_writer_rejects_mismatched_resume(tmp_path):
    path = write_random_features(tmp_path / "f.h5", [1], feature_dim=DIM)
    with pytest.raises(RegionFeatureError, match=r"f\.h5: cannot append with other options \(--dtype float16 in "
                                                 r"f\.h5, float32 in this command\); .* --overwrite"):
        RegionFeatureWriter(path, feature_dim=DIM, dtype="float32", append=True).open()
    assert not layout.partial_path(path).exists()  # refused before copying
    partial = _interrupted(tmp_path / "g.h5", [1])
    with pytest.raises(RegionFeatureError, match=r"g\.h5\.partial: an unfinished conversion with other inputs or "
                                                 r"options \(--feature-dim 16 in g\.h5\.partial, 17 in this "
                                                 r"command\)"):
        RegionFeatureWriter(tmp_path / "g.h5", feature_dim=DIM + 1).open()
    assert partial.exists()


def test_a_second_writer_of_the_same_output_is_refused(tmp_path):
    with RegionFeatureWriter(tmp_path / "f.h5", feature_dim=DIM) as writer:
        _add(writer, 1)
        with pytest.raises(RegionFeatureError, match=r"f\.h5\.partial\.lock: another process is writing this output"):
            RegionFeatureWriter(tmp_path / "f.h5", feature_dim=DIM).open()
    assert RegionFeatureStore(tmp_path / "f.h5").image_ids == [1]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["f.h5"]


KILLED_WRITER = """
import os, signal, sys
from common.features import RegionFeatureWriter, layout
from common.features.fixtures import random_region_features
writer = RegionFeatureWriter(sys.argv[1], feature_dim=16, buffer_rows=50)
writer.open()
for image_id in range(5):  # two batches of two images committed, one image queued
    item = random_region_features(image_id, 36, 16)
    writer.add(image_id, item.features, item.boxes, 480, 640, origin=f"in, line {image_id}")
file = writer._file  # a batch written but not yet committed when the kill comes
for name in layout.INDEX:
    file[name].resize(file[name].shape[0] + 1, axis=0)
file[layout.IMAGE_IDS][-1] = 99
file.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_writer_leaves_only_its_committed_images(tmp_path):
    """SIGKILL leaves the work file open in HDF5's eyes and holding an uncommitted index row: the
    store refuses it as incomplete, and the next writer rebuilds it from the committed images."""
    path = tmp_path / "f.h5"
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path)], cwd=ROOT, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with pytest.raises(RegionFeatureError, match=r"f\.h5\.partial: not marked complete: .*with 4 images so far"):
        RegionFeatureStore(layout.partial_path(path))
    with RegionFeatureWriter(path, feature_dim=DIM) as writer:
        assert len(writer) == 4 and all(image_id in writer for image_id in range(4))
        assert writer.already_stored(3, "in, line 3") and not writer.already_stored(4, "in, line 4")
        _add(writer, 4, "in, line 4")
    store = RegionFeatureStore(path)
    assert store.image_ids == [0, 1, 2, 3, 4]
    for image_id in range(5):
        _assert_same(store[image_id], random_region_features(image_id, 36, DIM))


def test_store_refuses_a_wrong_image_count(tmp_path):
    path = write_random_features(tmp_path / "f.h5", [1, 2], feature_dim=DIM)
    with h5py.File(path, "a") as file:
        file.attrs[layout.NUM_IMAGES] = 3
    with pytest.raises(RegionFeatureError, match=r"f\.h5: attribute 'num_images' is 3 but the index lists 2"):
        RegionFeatureStore(path)


def _as_version_1(path):
    """Rewrite a file as the writer of layout version 1 left it (no names, origins, sources, committed count,
    completeness)."""
    with h5py.File(path, "a") as file:
        for name in (layout.IMAGE_NAMES, layout.ORIGINS, layout.SOURCES, layout.COMMITTED):
            del file[name]
        del file.attrs[layout.COMPLETE], file.attrs[layout.NUM_IMAGES]
        file.attrs["version"] = 1
    return path


def test_a_version_1_file_is_refused_with_both_ways_out(tmp_path):
    path = _as_version_1(write_random_features(tmp_path / "f.h5", [1, 2], feature_dim=DIM))
    with pytest.raises(RegionFeatureError, match=r"f\.h5: written by an earlier version .* \(layout version 1\).* "
                                                 r"may hold only part of its inputs\. Re-run the command that wrote it "
                                                 r"with --append.*convert_features\.py mark-complete .*f\.h5$"):
        RegionFeatureStore(path)
    assert mark_complete(path) == 2
    store = RegionFeatureStore(path)
    assert store.image_ids == [1, 2] and store.image_names == ["", ""] and store.sources == []
    _assert_same(store[2], random_region_features(2, 36, DIM))


def test_appending_to_a_version_1_file_upgrades_it(tmp_path):
    path = _as_version_1(write_random_features(tmp_path / "f.h5", [1, 2], feature_dim=DIM))
    with RegionFeatureWriter(path, feature_dim=DIM, append=True) as writer:
        assert writer.already_stored(2, "in, line 2")  # no origin recorded: the image counts as converted
        _add(writer, 3, "in, line 3")
    store = RegionFeatureStore(path)
    assert store.image_ids == [1, 2, 3]
    _assert_same(store[1], random_region_features(1, 36, DIM))


def test_an_unfinished_file_cannot_be_marked_complete(tmp_path):
    partial = _interrupted(tmp_path / "f.h5", [1])
    with pytest.raises(RegionFeatureError, match=r"an unfinished conversion, which cannot be marked complete"):
        mark_complete(partial)


def test_names_map_to_fixed_ids():
    assert numeric_id("COCO_val2014_000000273052") == 273052 == numeric_id("COCO_train2014_000000273052")
    assert numeric_id("2410371") == 2410371 and numeric_id("000000000042") == 42
    nlvr2 = ["train-10171-0-img0", "train-10171-1-img0", "train-10171-0-img1", "dev-10171-0-img0"]
    ids = [numeric_id(name) for name in nlvr2]
    assert len(set(ids)) == 4 and all(-2**63 <= i < 0 for i in ids)
    assert ids[0] == numeric_id("train-10171-0-img0")  # a fixed function
    assert numeric_id("COCO_val2014_x") < 0 and numeric_id("1" * 19) < 0  # not an int64 number: hashed


def test_named_images_are_found_by_name_and_id(tmp_path):
    names = ["train-10171-0-img0", "train-10171-1-img0", "COCO_val2014_000000000042"]
    with RegionFeatureWriter(tmp_path / "f.h5", feature_dim=DIM) as writer:
        for name in names:
            item = random_region_features(numeric_id(name), 36, DIM)
            writer.add(numeric_id(name), item.features, item.boxes, 480, 640, name=name)
        with pytest.raises(RegionFeatureError, match=r"named 'train-1-0-img0', whose numeric id is"):
            writer.add(5, item.features, item.boxes, 480, 640, name="train-1-0-img0")
    store = RegionFeatureStore(tmp_path / "f.h5")
    assert store.image_names == names and store.image_ids == [numeric_id(name) for name in names]
    for name in names:
        assert name in store and store[name].name == name
        _assert_same(store[name], random_region_features(numeric_id(name), 36, DIM))
    assert store[42].name == "COCO_val2014_000000000042"
    with pytest.raises(MissingImageError, match=r"no features for image 'train-10171-2-img0' \(id -?\d+\)"):
        store["train-10171-2-img0"]


@pytest.mark.parametrize("features, boxes, match", [
    (np.ones((3, DIM + 1)), np.zeros((3, 4)), r"image id 5: features have shape \(3, 17\)"),
    (np.ones((3, DIM)), np.zeros((2, 4)), r"image id 5: boxes have shape \(2, 4\), expected \(3, 4\)"),
    (np.full((3, DIM), 1e5), np.zeros((3, 4)), r"image id 5: features contain NaN or infinity.*float16 overflows"),
    (np.full((3, DIM), np.nan), np.zeros((3, 4)), r"image id 5: features contain NaN or infinity$"),
])
def test_writer_rejects_bad_input(tmp_path, features, boxes, match):
    with RegionFeatureWriter(tmp_path / "f.h5", feature_dim=DIM) as writer:
        with pytest.raises(RegionFeatureError, match=match):
            writer.add(5, features, boxes, 480, 640)
        assert 5 not in writer


class _Items(torch.utils.data.Dataset):
    def __init__(self, store):
        self.store = store

    def __len__(self):
        return len(self.store)

    def __getitem__(self, index):
        return self.store[self.store.image_ids[index]]


def test_store_is_safe_in_dataloader_workers(tmp_path):
    ids = list(range(12))
    store = RegionFeatureStore(write_random_features(tmp_path / "f.h5", ids, num_regions=(2, 9), feature_dim=DIM))
    store[0]  # the parent opens its handle first: workers must open their own
    loader = DataLoader(_Items(store), batch_size=4, num_workers=2, collate_fn=pad_regions)
    seen = 0
    for features, boxes, mask in loader:
        for row in range(features.shape[0]):
            want = random_region_features(seen, (2, 9), DIM)
            assert torch.equal(features[row, :want.num_regions], want.features)
            assert int(mask[row].sum()) == want.num_regions
            seen += 1
    assert seen == 12
    clone = pickle.loads(pickle.dumps(store))
    _assert_same(clone[11], random_region_features(11, (2, 9), DIM))


def test_truncated_file_names_the_file(tmp_path):
    path = write_random_features(tmp_path / "f.h5", range(20), feature_dim=DIM)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(RegionFeatureError, match=r"f\.h5: cannot open as HDF5.*truncated"):
        RegionFeatureStore(path)


def test_corrupt_features_name_the_file_and_image_id(tmp_path):
    path = write_random_features(tmp_path / "f.h5", range(8), feature_dim=DIM)
    store = RegionFeatureStore(path)
    row = store._first[5]  # the first region of image 5; every chunk is Fletcher-32 checksummed
    with h5py.File(path, "r") as file:
        dataset = file[layout.FEATURES]
        chunk = dataset.id.get_chunk_info_by_coord((row - row % dataset.chunks[0], 0))
    data = bytearray(path.read_bytes())
    data[chunk.byte_offset + 7] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(RegionFeatureError, match=r"f\.h5: the features of image id 5 cannot be read"):
        RegionFeatureStore(path)[5]


def test_other_hdf5_files_are_rejected_with_the_field(tmp_path):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as file:
        file["x"] = np.zeros(3)
    with pytest.raises(RegionFeatureError, match=r"other\.h5: attribute 'format' is None"):
        RegionFeatureStore(path)
    with pytest.raises(RegionFeatureError, match=r"other\.h5: an HDF5 file that is not a region-feature file"):
        RegionFeatureWriter(path, feature_dim=DIM).open()
    with h5py.File(path, "r") as file:
        assert list(file) == ["x"]  # left untouched
