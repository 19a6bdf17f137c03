"""Att2in on the shared runtime: bf16 autocast follows fp32, and a run written on a GPU resumes and
evaluates on the CPU."""
from captioning import evaluate

from ..runtime_checks import BF16, assert_follows, rewrite_as_written_on_cuda
from .probes import train_probe


def test_bf16_autocast_training_follows_fp32(coco_fixture, tiny_overrides, tmp_path):
    root = coco_fixture["root"]
    fp32 = train_probe(root, tmp_path, tiny_overrides, precision="fp32")
    assert_follows(train_probe(root, tmp_path, tiny_overrides, precision="bf16"), fp32, **BF16)
    assert fp32["results"]["runtime"] == {"device": "cpu", "precision": "fp32", "compile": False, "world_size": 1}


def test_a_run_written_on_a_gpu_resumes_and_evaluates_on_the_cpu(coco_fixture, tiny_overrides, tmp_path):
    root = coco_fixture["root"]
    whole = train_probe(root, tmp_path / "whole", tiny_overrides, epochs=2)
    half = train_probe(root, tmp_path / "half", tiny_overrides, epochs=1)
    assert rewrite_as_written_on_cuda(half["out"]) == 2  # best.pt and checkpoints/step_4.pt
    resumed = train_probe(root, tmp_path / "half", tiny_overrides, epochs=2)
    assert resumed["losses"] == whole["losses"]
    rewrite_as_written_on_cuda(resumed["out"])
    scores = evaluate.evaluate_checkpoint(resumed["out"], split="val", beam_size=1, metrics=["cider"],
                                          progress=False)["scores"]
    assert scores["CIDEr"] == whole["results"]["val"]["CIDEr"]
