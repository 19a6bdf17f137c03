"""GAT on the shared runtime: bf16 autocast follows fp32, and checkpoints written on a GPU evaluate
and are reused on the CPU."""
from common.utils import atomic_save, atomic_write_json
from graphattn import evaluate, training

from ..runtime_checks import BF16, assert_follows, rewrite_as_written_on_cuda
from .probes import train_probe


def test_bf16_autocast_training_follows_fp32():
    fp32, bf16 = train_probe(precision="fp32"), train_probe(precision="bf16")
    assert_follows(bf16, fp32, **BF16)
    assert fp32["losses"][-1] < fp32["losses"][0]  # it trains


def test_a_seed_written_on_a_gpu_evaluates_and_is_reused_on_the_cpu(tmp_path, monkeypatch):
    run = train_probe(precision="fp32", epochs=3)
    cfg, data = run["cfg"], run["data"]
    cfg.out_dir, cfg.seeds = str(tmp_path), 1
    atomic_save(run["checkpoint"], tmp_path / "seed0.pt")
    atomic_write_json(tmp_path / "seed0.json", run["checkpoint"]["metrics"])  # its record: the seed is finished
    assert rewrite_as_written_on_cuda(tmp_path) == 1
    report = evaluate.evaluate_checkpoint(tmp_path / "seed0.pt", data_cache={"Cora": data})
    assert report["test"]["loss"] == run["eval"]

    def retrain(*args, **kwargs):
        raise AssertionError("a finished seed was trained again")

    monkeypatch.setattr(training.GATTask, "__init__", retrain)
    results = training.run(cfg, progress=False, data=data)  # the finished seed is reused, not retrained
    assert results["test_acc"]["per_seed"] == [100 * run["checkpoint"]["metrics"]["test"]["acc"]]
