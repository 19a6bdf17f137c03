"""common.features: the HDF5 region-feature store, writer, padding and fixtures."""
import pickle

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from common.features import (MissingImageError, RegionFeatureError, RegionFeatures, RegionFeatureStore,
                             RegionFeatureWriter, pad_regions)
from common.features import layout
from common.features.fixtures import random_region_features, write_random_features

DIM = 16


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


def test_writing_a_file_that_is_being_read_is_a_clear_error(tmp_path):
    path = write_random_features(tmp_path / "f.h5", [1], feature_dim=DIM)
    with RegionFeatureStore(path) as store:
        store[1]
        with pytest.raises(RegionFeatureError, match=r"f\.h5: cannot open with mode 'a'.*close its RegionFeatureStore"):
            RegionFeatureWriter(path, feature_dim=DIM).open()
    with RegionFeatureWriter(path, feature_dim=DIM) as writer:  # closed: writable again
        assert 1 in writer


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


def test_writer_resumes_and_skips_stored_ids(tmp_path):
    path = tmp_path / "f.h5"
    write_random_features(path, [1, 2], feature_dim=DIM)
    with RegionFeatureWriter(path, feature_dim=DIM) as writer:
        assert 1 in writer and 2 in writer and len(writer) == 2
        with pytest.raises(RegionFeatureError, match="image id 2 is already stored"):
            item = random_region_features(2, 36, DIM)
            writer.add(2, item.features, item.boxes, 480, 640)
        item = random_region_features(3, 36, DIM)
        writer.add(3, item.features, item.boxes, 480, 640)
    store = RegionFeatureStore(path)
    assert store.image_ids == [1, 2, 3]
    for i in (1, 2, 3):
        _assert_same(store[i], random_region_features(i, 36, DIM))


def test_interrupted_flush_leaves_only_complete_images(tmp_path):
    """Regions written without their index rows (a run killed mid-flush) are dropped on resume."""
    path = write_random_features(tmp_path / "f.h5", [1], feature_dim=DIM)
    with h5py.File(path, "a") as file:  # the state after a crash: orphan rows and an uneven index
        for name in (layout.FEATURES, layout.BOXES):
            file[name].resize(file[name].shape[0] + 10, axis=0)
        file[layout.IMAGE_IDS].resize(2, axis=0)
        file[layout.IMAGE_IDS][1] = 2
    with RegionFeatureWriter(path, feature_dim=DIM) as writer:
        assert 2 not in writer and len(writer) == 1
        item = random_region_features(2, 36, DIM)
        writer.add(2, item.features, item.boxes, 480, 640)
    store = RegionFeatureStore(path)
    assert store.image_ids == [1, 2]
    _assert_same(store[2], random_region_features(2, 36, DIM))
    with h5py.File(path, "r") as file:
        assert file[layout.FEATURES].shape[0] == 72


def test_writer_rejects_mismatched_resume(tmp_path):
    path = write_random_features(tmp_path / "f.h5", [1], feature_dim=DIM)
    with pytest.raises(RegionFeatureError, match=r"16-d float16 features.*asked for 16-d float32"):
        RegionFeatureWriter(path, feature_dim=DIM, dtype="float32").open()


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
