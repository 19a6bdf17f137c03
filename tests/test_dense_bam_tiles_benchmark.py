"""benchmarks/dense_bam_tiles.py in Triton's interpreter: candidate tiles reach the kernels, each row's error
column compares the operator with the materialised path, and the shipped lookup is restored afterwards."""
import json
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _measure, dense_bam_tiles  # noqa: E402
from common.attention.kernels import dense_bam as kernels, interpreting, triton_available  # noqa: E402

pytestmark = pytest.mark.skipif(not triton_available() or torch.cuda.is_available() or not interpreting(),
                                reason="the interpreter run (a GPU runs the script itself)")


def test_a_candidate_tile_replaces_the_shipped_one_only_inside_the_block():
    shipped = kernels.tiles(torch.bfloat16, 64, 64, False)
    with dense_bam_tiles.TileChoice() as choice:
        choice.backward = (16, 64, 4, 1)
        tiles = kernels.tiles(torch.bfloat16, 64, 64, False)
        assert [tiles.backward[k] for k in dense_bam_tiles.TILE_KEYS] == [16, 64, 4, 1]
        assert tiles.forward == shipped.forward
        assert kernels.tiles(torch.float32, 128, 128, False) is None  # no tiles stay no tiles
    assert kernels.tiles is choice.shipped


def test_each_row_reports_its_errors_against_the_materialised_path(tmp_path, monkeypatch):
    monkeypatch.setattr(_measure, "RESULTS_DIR", tmp_path)
    before = os.environ.get("ATTN_TRITON"), torch.backends.cuda.matmul.allow_tf32
    assert dense_bam_tiles.main(["--dtype", "fp32", "--length", "40", "--batch-heads", "8", "--dropout", "0.2",
                                 "--forward", "16x16x4x2", "--backward", "16x32x4x2"]) == 0
    result = json.loads((tmp_path / "dense_bam_tiles.json").read_text())
    assert [(r["forward"], r["backward"]) for r in result["rows"]] == [
        ("shipped", "shipped"), ("16x16x4x2", "shipped"), ("shipped", "16x32x4x2")]
    for row in result["rows"]:
        assert {"out", "kl", "dq", "dk", "dv"} <= set(row["errors"]) and row["right"]
        assert row["worst"] < 1e-3
    assert not isinstance(kernels.tiles, dense_bam_tiles.TileChoice)
    assert (os.environ.get("ATTN_TRITON"), torch.backends.cuda.matmul.allow_tf32) == before  # later tests keep theirs


def test_a_bad_tile_is_refused_with_the_form_to_write(capsys):
    with pytest.raises(SystemExit):
        dense_bam_tiles.main(["--backward", "16x16"])
    assert "'16x16': write BLOCK_MxBLOCK_NxWARPSxSTAGES, e.g. 32x128x8x2" in capsys.readouterr().err
