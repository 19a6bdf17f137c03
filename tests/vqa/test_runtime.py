"""MCAN on the shared runtime: bf16 autocast follows fp32, and a run written on a GPU resumes and
evaluates on the CPU."""
import json

from vqa import evaluate

from ..runtime_checks import BF16, assert_follows, rewrite_as_written_on_cuda
from .probes import mcan_probe


def test_bf16_autocast_training_follows_fp32(vqa_fixture, tmp_path):
    fp32 = mcan_probe(vqa_fixture.root, tmp_path, precision="fp32")
    assert_follows(mcan_probe(vqa_fixture.root, tmp_path, precision="bf16"), fp32, **BF16)


def test_a_run_written_on_a_gpu_resumes_and_evaluates_on_the_cpu(vqa_fixture, tmp_path):
    whole = mcan_probe(vqa_fixture.root, tmp_path / "whole", extra=["--epochs", "2"])
    half = mcan_probe(vqa_fixture.root, tmp_path / "half")
    assert rewrite_as_written_on_cuda(half["out"]) == 1
    resumed = mcan_probe(vqa_fixture.root, tmp_path / "half", extra=["--epochs", "2"])
    assert resumed["losses"] == whole["losses"] and resumed["eval"] == whole["eval"]
    rewrite_as_written_on_cuda(resumed["out"])
    assert evaluate.main([str(resumed["out"]), "--no-progress", "--device", "cpu"]) == 0
    accuracy = json.loads((resumed["out"] / "eval_val.json").read_text())["conditions"]["clean"]["accuracy"]
    assert accuracy == json.loads((whole["out"] / "results.json").read_text())["final_eval"]
