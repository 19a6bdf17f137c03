"""common.features.extract and scripts/extract_features.py, with a fake detector."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from common.features import RegionFeatureError, RegionFeatureStore, numeric_id
from common.features.extract import (Proposals, Selection, box_iou, extract, image_files, image_sources, load_image,
                                     nms_keep, select_regions)

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
DIM = 12
REAL_IMAGE = "coco/updown/COCO_val2014_000000273052.jpg"


class FakeDetector:
    """R proposals at random places (seeded by the image), softmax class scores over 1 + C
    classes, and features that depend on the pixels inside each box."""

    def __init__(self, proposals=60, classes=5):
        self.proposals, self.classes = proposals, classes

    def detect(self, image):
        height, width = image.shape[:2]
        rng = np.random.default_rng(int(image.sum()) % 2**32)
        corners = rng.uniform(0, 1, size=(self.proposals, 2, 2)) * [width, height]
        boxes = np.concatenate([corners.min(1), corners.max(1)], axis=1)
        logits = rng.normal(0, 2, size=(self.proposals, 1 + self.classes))
        features = np.stack([self.box_feature(image, box) for box in boxes])
        return Proposals(torch.tensor(boxes, dtype=torch.float32), torch.softmax(torch.tensor(logits), -1),
                         torch.tensor(features, dtype=torch.float32))

    @staticmethod
    def box_feature(image, box):
        x1, y1, x2, y2 = (int(v) for v in box)
        crop = image[y1:max(y2, y1 + 1), x1:max(x2, x1 + 1)].reshape(-1, 3).astype(np.float32) / 255
        return np.tile(crop.mean(0), DIM // 3)


def reference_nms(boxes, scores, threshold):
    """py-faster-rcnn's nms.py loop, with continuous areas."""
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1) * (y2 - y1)
    order = scores.argsort()[::-1]
    keep = []
    while order.size > 0:
        i = order[0]
        keep.append(i)
        w = np.maximum(0.0, np.minimum(x2[i], x2[order[1:]]) - np.maximum(x1[i], x1[order[1:]]))
        h = np.maximum(0.0, np.minimum(y2[i], y2[order[1:]]) - np.maximum(y1[i], y1[order[1:]]))
        inter = w * h
        ovr = inter / (areas[i] + areas[order[1:]] - inter)
        order = order[np.where(ovr <= threshold)[0] + 1]
    return sorted(keep)


def test_box_iou():
    boxes = torch.tensor([[0., 0., 2., 2.], [1., 1., 3., 3.], [5., 5., 6., 6.], [0., 0., 0., 4.]])
    iou = box_iou(boxes)
    assert iou[0, 1].item() == pytest.approx(1 / 7)
    assert iou[0, 0].item() == 1 and iou[0, 2].item() == 0
    assert iou[3, 3].item() == 0 and torch.isfinite(iou).all()  # an empty box overlaps nothing


def test_vectorised_nms_matches_the_reference_loop():
    rng = np.random.default_rng(0)
    corners = rng.uniform(0, 100, size=(80, 2, 2))
    boxes = np.concatenate([corners.min(1), corners.max(1) + 1], axis=1)
    scores = rng.uniform(size=(7, 80))
    keep = nms_keep(box_iou(torch.tensor(boxes)), torch.tensor(scores), 0.3)
    for c in range(7):
        assert torch.nonzero(keep[c]).flatten().tolist() == reference_nms(boxes, scores[c], 0.3)


def _proposals(max_conf):
    """Disjoint boxes (NMS keeps all) whose best class score is ``max_conf``."""
    n = len(max_conf)
    boxes = torch.tensor([[10. * i, 0., 10. * i + 5, 5.] for i in range(n)])
    scores = torch.zeros(n, 3)
    scores[:, 2] = torch.tensor(max_conf)
    scores[:, 1] = torch.tensor(max_conf) / 2
    scores[:, 0] = 1 - scores[:, 1:].sum(1)
    return Proposals(boxes, scores, torch.arange(n, dtype=torch.float32)[:, None].repeat(1, DIM))


def test_selection_thresholds_and_clamps():
    conf = [0.1, 0.5, 0.25, 0.05, 0.9, 0.19]
    assert select_regions(_proposals(conf), Selection(1, 10)).tolist() == [1, 2, 4]  # >= 0.2, index order
    assert select_regions(_proposals(conf), Selection(5, 10)).tolist() == [4, 1, 2, 5, 0]  # too few: top 5
    assert select_regions(_proposals(conf), Selection(1, 2)).tolist() == [4, 1]  # too many: top 2


def test_nms_suppresses_before_max_conf():
    """A duplicate box loses its class score to the better one, as in generate_tsv.py."""
    proposals = _proposals([0.9, 0.6])
    proposals.boxes[1] = proposals.boxes[0] + 0.1
    assert select_regions(proposals, Selection(1, 10)).tolist() == [0]


def _write_images(directory, ids):
    from PIL import Image
    directory.mkdir()
    rng = np.random.default_rng(0)
    for image_id in ids:
        pixels = rng.integers(0, 256, size=(60 + image_id, 80, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(directory / f"COCO_val2014_{image_id:012d}.png")
    return directory


def test_extract_writes_the_selected_regions_and_resumes(tmp_path):
    pytest.importorskip("PIL")
    images = image_files([_write_images(tmp_path / "images", [3, 1, 2])])
    assert [image_id for image_id, _ in images] == [1, 2, 3]
    selection = Selection(min_boxes=10, max_boxes=20)
    output = tmp_path / "out.h5"
    assert extract(images[:2], FakeDetector(), output, selection, feature_dim=DIM, dtype="float32",
                   progress=False) == {"written": 2, "skipped": 0, "images": 2, "unchanged": False}
    with pytest.raises(RegionFeatureError, match=r"out\.h5 already exists .*pass --append"):
        extract(images, FakeDetector(), output, selection, feature_dim=DIM, dtype="float32", progress=False)
    with pytest.raises(RegionFeatureError, match=r"out\.h5: cannot append with other options \(--min-boxes 10 in "
                                                 r"out\.h5, 36 in this command; --max-boxes 20 in out\.h5, 36 in this "
                                                 r"command\)"):
        extract(images, FakeDetector(), output, Selection(36, 36), feature_dim=DIM, dtype="float32", progress=False,
                append=True)
    assert extract(images, FakeDetector(), output, selection, feature_dim=DIM, dtype="float32", progress=False,
                   append=True) == {"written": 1, "skipped": 2, "images": 3, "unchanged": False}
    store = RegionFeatureStore(output)
    assert store.options == {"dtype": "float32", "feature_dim": DIM, "min_boxes": 10, "max_boxes": 20,
                             "conf_thresh": 0.2, "nms_thresh": 0.3}
    for image_id, path in images:
        image = load_image(path)
        proposals = FakeDetector().detect(image)
        kept = select_regions(proposals, selection)
        item = store[image_id]
        assert item.image_size == (60 + image_id, 80)
        assert 10 <= item.num_regions <= 20
        torch.testing.assert_close(item.boxes, proposals.boxes[kept])
        torch.testing.assert_close(item.features, proposals.features[kept])
        box = item.boxes[0].numpy()
        np.testing.assert_allclose(item.features[0].numpy(), FakeDetector.box_feature(image, box), rtol=1e-6)


@pytest.mark.realdata
def test_extract_reads_the_real_coco_image(tmp_path, attn_data_root):
    pytest.importorskip("PIL")
    path = attn_data_root / REAL_IMAGE
    images = image_files([path])
    assert images == [(273052, path)]
    image = load_image(path)
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    counts = extract(images, FakeDetector(proposals=150, classes=20), tmp_path / "real.h5",
                     Selection(36, 36), feature_dim=DIM, progress=False)
    assert counts["written"] == 1
    item = RegionFeatureStore(tmp_path / "real.h5")[273052]
    assert item.num_regions == 36 and item.image_size == image.shape[:2]
    assert (item.boxes[:, 2] <= image.shape[1]).all() and (item.boxes[:, 3] <= image.shape[0]).all()


class StopsAfter(FakeDetector):
    def __init__(self, count):
        super().__init__()
        self.left = count

    def detect(self, image):
        if not self.left:
            raise KeyboardInterrupt
        self.left -= 1
        return super().detect(image)


def test_interrupted_extraction_resumes_and_records_its_inputs(tmp_path):
    pytest.importorskip("PIL")
    directory = _write_images(tmp_path / "images", [1, 2, 3])
    images, sources = image_files([directory]), image_sources([directory])
    output = tmp_path / "out.h5"
    with pytest.raises(KeyboardInterrupt):
        extract(images, StopsAfter(2), output, feature_dim=DIM, progress=False, sources=sources)
    assert not output.exists()
    assert extract(images, FakeDetector(), output, feature_dim=DIM, progress=False, sources=sources) == {
        "written": 1, "skipped": 2, "images": 3, "unchanged": False}
    store = RegionFeatureStore(output)
    assert store.image_names == [f"COCO_val2014_{i:012d}" for i in (1, 2, 3)]
    assert store.sources == [{"path": str(directory), "format": "images", "files": 3,
                              "bytes": sum(path.stat().st_size for _, path in images)}]
    assert extract(images, FakeDetector(), output, feature_dim=DIM, progress=False, sources=sources) == {
        "written": 0, "skipped": 3, "images": 3, "unchanged": True}
    with pytest.raises(RegionFeatureError, match=r"out\.h5 already exists \(3 images from .*\) and differs from this "
                                                 r"command: --max-boxes 100 in out\.h5, 50 in this command; pass "
                                                 r"--overwrite"):
        extract(images, FakeDetector(), output, Selection(max_boxes=50), feature_dim=DIM, progress=False,
                sources=sources)


def test_image_ids_come_from_whole_file_names(tmp_path):
    for name in ("COCO_val2014_000000000007.jpg", "2410371.jpg", "train-10171-0-img0.png", "train-10171-1-img0.png"):
        (tmp_path / name).write_bytes(b"")
    found = dict((path.name, image_id) for image_id, path in image_files([tmp_path]))
    assert found["COCO_val2014_000000000007.jpg"] == 7 and found["2410371.jpg"] == 2410371
    assert found["train-10171-0-img0.png"] == numeric_id("train-10171-0-img0") != found["train-10171-1-img0.png"]
    with pytest.raises(RegionFeatureError, match=r"nowhere: no such image file or directory"):
        image_files([tmp_path / "nowhere"])
    (tmp_path / "notes.txt").write_bytes(b"")
    with pytest.raises(RegionFeatureError, match="no .jpg/.jpeg/.png images"):
        image_files([tmp_path / "notes.txt"])


def test_unreadable_image_names_the_file(tmp_path):
    pytest.importorskip("PIL")
    (tmp_path / "COCO_val2014_000000000001.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(RegionFeatureError, match=r"000000000001\.jpg: cannot read the image"):
        load_image(tmp_path / "COCO_val2014_000000000001.jpg")


def _script():
    return load_script("scripts/extract_features.py")


def test_cli_explains_how_to_install_detectron2(tmp_path, capsys):
    if importlib.util.find_spec("detectron2") is not None:
        pytest.skip("detectron2 is installed: the missing-package message cannot be shown")
    _write_images(tmp_path / "images", [1])
    code = _script().main([str(tmp_path / "images"), "--output", str(tmp_path / "o.h5"), "--config-file", "c.yaml",
                           "--weights", "w.pkl", "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert "detectron2 is not installed" in err and "pip install" in err
    assert not (tmp_path / "o.h5").exists()


def test_cli_rebuilds_a_store_with_other_options_only_with_overwrite(tmp_path, capsys, monkeypatch):
    pytest.importorskip("PIL")
    monkeypatch.setattr("common.features.detectron2_detector.Detectron2Detector", lambda *a, **k: FakeDetector())
    script, output = _script(), tmp_path / "out.h5"
    argv = [str(_write_images(tmp_path / "images", [1, 2])), "--output", str(output), "--config-file", "c.yaml",
            "--weights", "w.pkl", "--feature-dim", str(DIM), "--quiet"]
    assert script.main(argv) == 0 and RegionFeatureStore(output).options["max_boxes"] == 100
    capsys.readouterr()
    assert script.main(argv + ["--max-boxes", "50"]) == 2
    err = capsys.readouterr().err
    assert "--max-boxes 100 in out.h5, 50 in this command" in err and "--overwrite" in err
    assert RegionFeatureStore(output).options["max_boxes"] == 100  # the refused command left the store as it was
    assert script.main(argv + ["--max-boxes", "50", "--overwrite"]) == 0
    assert json.loads(capsys.readouterr().out) == {"output": str(output), "written": 2, "skipped": 0, "images": 2,
                                                   "unchanged": False}
    assert RegionFeatureStore(output).options["max_boxes"] == 50 and not Path(f"{output}.partial").exists()
    with pytest.raises(SystemExit) as exit_:
        script.main(argv + ["--append", "--overwrite"])
    assert exit_.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
