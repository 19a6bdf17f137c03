"""scripts/convert_features.py: every subcommand converts its fixture; resumes; clear errors."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from common.features import RegionFeatureStore
from common.features.fixtures import random_region_features, write_format_fixtures

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


@pytest.mark.parametrize("name", ["bottom-up-tsv", "lxmert-tsv", "selfcritical-npz", "mcan-npz"])
def test_cli_converts_and_resumes(tmp_path, fixtures, capsys, name):
    output = tmp_path / "out.h5"
    argv = arguments(name, fixtures) + ["--output", str(output), "--feature-dim", str(DIM), "--quiet"]
    assert convert_features.main(argv) == 0
    assert json.loads(capsys.readouterr().out) == {"output": str(output), "written": 3, "skipped": 0, "images": 3}
    with RegionFeatureStore(output) as store:
        for image_id in IDS:
            want = random_region_features(image_id, (2, 6), DIM)
            assert torch.equal(store[image_id].features, want.features)
            assert store[image_id].image_size == want.image_size
    assert convert_features.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] == 3


def test_cli_error_names_the_file(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert convert_features.main(["mcan-npz", str(missing), "--output", str(tmp_path / "o.h5"), "--quiet"]) == 1
    assert f"error: {missing}: no such directory of MCAN .npz features" in capsys.readouterr().err
