"""scripts/convert_features.py: every subcommand converts its fixture; resumes, also after a SIGKILL;
publishes only complete stores; clear errors that leave no output."""
import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest
import torch

from common.features import RegionFeatureError, RegionFeatureStore, layout
from common.features.fixtures import random_region_features, write_format_fixtures, write_random_features
from common.features.formats import bottom_up_tsv

ROOT = Path(__file__).resolve().parents[2]
DIM = 8
IDS = [5, 3, 11]


def _load_script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


convert_features = _load_script("convert_features")


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    return write_format_fixtures(tmp_path_factory.mktemp("cli"), IDS, num_regions=(2, 6), feature_dim=DIM)


def arguments(name, paths):
    if name == "selfcritical-npz":
        root = paths[name]
        return [name, "--att-dir", str(root / "cocobu_att"), "--box-dir", str(root / "cocobu_box"),
                "--image-info", str(root / "image_info.json")]
    return [name, str(paths[name])]


def options(output):
    return ["--output", str(output), "--feature-dim", str(DIM), "--quiet"]


@pytest.mark.parametrize("name", ["bottom-up-tsv", "lxmert-tsv", "selfcritical-npz", "mcan-npz"])
def test_cli_converts_and_resumes(tmp_path, fixtures, capsys, name):
    output = tmp_path / "out.h5"
    argv = arguments(name, fixtures) + options(output)
    assert convert_features.main(argv) == 0
    assert json.loads(capsys.readouterr().out) == {"output": str(output), "written": 3, "skipped": 0, "images": 3,
                                                   "unchanged": False}
    with RegionFeatureStore(output) as store:
        for image_id in IDS:
            want = random_region_features(image_id, (2, 6), DIM)
            assert torch.equal(store[image_id].features, want.features)
            assert store[image_id].image_size == want.image_size
        assert {source["format"] for source in store.sources} >= {name}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.h5"]
    assert convert_features.main(argv) == 0  # the same command again: nothing to do
    assert json.loads(capsys.readouterr().out) == {"output": str(output), "written": 0, "skipped": 0, "images": 3,
                                                   "unchanged": True}


def test_cli_error_names_the_file(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert convert_features.main(["mcan-npz", str(missing), "--output", str(tmp_path / "o.h5"), "--quiet"]) == 1
    assert f"error: {missing}: no such directory of MCAN" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind, message", [("empty", "the file is empty (0 bytes)"), ("missing", "no such file"),
                                           ("folder", "is a directory, expected a bottom-up TSV file")])
def test_bad_input_paths_are_clean_errors_that_create_no_output(tmp_path, fixtures, capsys, kind, message):
    bad = tmp_path / "in"
    if kind == "empty":
        bad.write_bytes(b"")
    elif kind == "folder":
        bad.mkdir()
    output = tmp_path / "out" / "out.h5"
    argv = ["bottom-up-tsv", str(fixtures["bottom-up-tsv"]), str(bad)] + options(output)
    assert convert_features.main(argv) == 1
    assert f"error: {bad}: {message}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_existing_output_needs_append_which_is_atomic(tmp_path, fixtures, capsys):
    output = tmp_path / "out.h5"
    assert convert_features.main(arguments("mcan-npz", fixtures) + options(output)) == 0
    before = output.read_bytes()
    more = bottom_up_tsv.write(tmp_path / "more.tsv", [random_region_features(i, (2, 6), DIM) for i in (20, 21)])
    argv = ["bottom-up-tsv", str(more)] + options(output)
    capsys.readouterr()
    assert convert_features.main(argv) == 1
    assert f"error: {output} already exists (3 images from {fixtures['mcan-npz']} (3 files" in capsys.readouterr().err
    assert output.read_bytes() == before
    assert convert_features.main(argv + ["--append"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 5
    store = RegionFeatureStore(output)
    assert sorted(store.image_ids) == sorted(IDS + [20, 21])
    assert [source["format"] for source in store.sources] == ["mcan-npz", "bottom-up-tsv"]
    assert torch.equal(store[21].features, random_region_features(21, (2, 6), DIM).features)
    assert convert_features.main(argv) == 0 and json.loads(capsys.readouterr().out)["unchanged"]


def test_mark_complete_makes_a_version_1_store_readable(tmp_path, capsys):
    path = write_random_features(tmp_path / "old.h5", [4, 5], feature_dim=DIM)
    with h5py.File(path, "a") as file:  # as layout version 1 wrote it
        for name in (layout.IMAGE_NAMES, layout.ORIGINS, layout.SOURCES, layout.COMMITTED):
            del file[name]
        del file.attrs[layout.COMPLETE], file.attrs[layout.NUM_IMAGES]
        file.attrs["version"] = 1
    with pytest.raises(RegionFeatureError, match="mark-complete"):
        RegionFeatureStore(path)
    assert convert_features.main(["mark-complete", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == {"marked_complete": {str(path): 2}}
    assert RegionFeatureStore(path).image_ids == [4, 5]


KILL_IMAGES = 1000
KILL_DIM = 32


def test_a_conversion_killed_midway_is_refused_then_resumed(tmp_path, capsys):
    """SIGKILL once the work file holds a few batches: the output does not exist, the work file is
    refused as incomplete, and the same command resumes it (skipping what was stored) to a whole store."""
    tsv = bottom_up_tsv.write(tmp_path / "in.tsv",
                              (random_region_features(i, 36, KILL_DIM) for i in range(KILL_IMAGES)))
    output = tmp_path / "out.h5"
    partial = layout.partial_path(output)
    argv = ["bottom-up-tsv", str(tsv), "--output", str(output), "--feature-dim", str(KILL_DIM), "--quiet"]
    process = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "convert_features.py"), *argv], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # one batch (8192 rows) of 32-d float16 regions and their boxes is about 0.65 MB; kill after two
    while process.poll() is None and not (partial.exists() and partial.stat().st_size > 1_500_000):
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the conversion ended before it could be killed"
    assert not output.exists()
    with pytest.raises(RegionFeatureError, match=r"out\.h5: not written yet: .*out\.h5\.partial; re-run the same "
                                                 r"command to resume"):
        RegionFeatureStore(output)
    with pytest.raises(RegionFeatureError, match=r"out\.h5\.partial: not marked complete: .* Re-run the same "
                                                 r"command to resume"):
        RegionFeatureStore(partial)
    assert convert_features.main(argv) == 0  # the same command, in this process
    counts = json.loads(capsys.readouterr().out)
    assert counts["images"] == KILL_IMAGES and counts["skipped"] > 0
    assert counts["written"] + counts["skipped"] == KILL_IMAGES
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.tsv", "out.h5"]
    store = RegionFeatureStore(output)
    assert store.image_ids == list(range(KILL_IMAGES))
    for image_id in range(0, KILL_IMAGES, 37):
        assert torch.equal(store[image_id].features, random_region_features(image_id, 36, KILL_DIM).features)
