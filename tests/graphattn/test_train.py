"""Configs, and short real training/evaluation runs on Cora through the CLIs."""
import json

import pytest
import torch

from common.utils import read_metrics
from graphattn import evaluate, train
from graphattn.config import load_config


def test_config_layers_dataset_file_and_overrides():
    cfg = load_config("pubmed", "bam-wc", ["optim.lr=0.02", "attention.options.k=7"])
    assert cfg.dataset == "PubMed" and cfg.model.out_heads == 8 and cfg.optim.weight_decay == 0.001
    assert cfg.optim.lr == 0.02 and cfg.attention.name == "bam-wc" and cfg.attention.options.k == 7


def test_config_variant_block_sets_the_tuned_bam_options():
    cfg = load_config("cora", "bam-wc")
    assert cfg.attention.options, "cora.yaml must hold the tuned bam-wc options"
    assert "variants" not in cfg


def test_misspelt_config_key_is_an_error():
    with pytest.raises(ValueError, match="lrr"):
        load_config("cora", None, ["optim.lrr=0.1"])


@pytest.mark.realdata
def test_short_bam_training_beats_chance_and_evaluates(attn_data_root, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--dataset", "Cora", "--attention", "bam-wc", "--seeds", "2", "--data-root", str(attn_data_root),
            "--out", str(out), "--no-progress", "train.max_epochs=40", "kl.weight=0.1", "train.num_threads=1"]
    # 40 epochs are too few for the accuracy bounds below with value dropout (its MC samples
    # are too noisy this early); the curves test covers it.
    args.insert(-2, "model.value_dropout=0.0")
    assert train.main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert len(results["test_acc"]["per_seed"]) == 2
    # Chance is 1/7 (14%) and the majority class 32%: 40 epochs must do far better.
    assert results["test_acc"]["mean"] > 65
    assert results["config"]["attention"]["name"] == "bam-wc" and results["config"]["kl"]["weight"] == 0.1
    assert results["environment"]["packages"]["torch"] == torch.__version__
    history = read_metrics(out / "seed0" / "metrics.jsonl")
    assert history[-1]["train/kl"] > 0 and len(history) == results["epochs"][0]

    # Resuming reuses the finished seeds instead of retraining them.
    stamps = [(out / f"seed{s}.pt").stat().st_mtime_ns for s in (0, 1)]
    assert train.main(args) == 0
    assert [(out / f"seed{s}.pt").stat().st_mtime_ns for s in (0, 1)] == stamps
    # ... but refuses a checkpoint trained with another config.
    assert train.main(args[:-2] + ["kl.weight=0.2"]) == 2
    err = capsys.readouterr().err  # the shared guard: names each changed key and the --out flag
    assert "holds a run with a different config (kl.weight: 0.1 -> 0.2" in err and "another output directory (--out)" in err

    report = out / "eval.json"
    assert evaluate.main([str(out), "--mc-samples", "4", "--out", str(report)]) == 0
    evaluated = json.loads(report.read_text())
    for entry in evaluated["checkpoints"]:
        assert entry["test"]["acc"] == pytest.approx(entry["stored_test_acc"])
        assert 0 <= entry["mc"]["pavpu_ttest"] <= 1 and 0 <= entry["mc"]["ece"] <= 1
    assert evaluated["summary"]["mc_acc"]["mean"] > 60


@pytest.mark.realdata
def test_short_cora_run_logs_curves_to_jsonl_and_tensorboard(attn_data_root, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    args = ["--dataset", "Cora", "--attention", "bam-wc", "--seeds", "1", "--data-root", str(attn_data_root),
            "--out", str(out), "--no-progress", "train.max_epochs=5", "kl.weight=0.1",
            "model.value_dropout=0.6", "train.num_threads=1"]
    # Leftovers of an interrupted attempt at the seed are replaced, not appended to.
    (out / "seed0").mkdir(parents=True)
    (out / "seed0" / "metrics.jsonl").write_text('{"step": 99, "val/acc": 0.0}\n')
    assert train.main(args) == 0
    records = read_metrics(out / "seed0" / "metrics.jsonl")
    keys = {"train/loss", "train/ce", "train/acc", "train/kl", "train/kl_weight", "val/loss", "val/acc"}
    # a row per epoch (from 1), at its update: one per epoch on the whole graph
    assert [r["epoch"] for r in records] == [r["step"] for r in records] == list(range(1, 6))
    assert all(keys <= set(r) for r in records)
    for r in records:
        assert r["train/loss"] == pytest.approx(r["train/ce"] + 0.1 * r["train/kl"], rel=1e-5)
        assert 0 <= r["train/acc"] <= 1 and 0 <= r["val/acc"] <= 1
    checkpoint = torch.load(out / "seed0.pt", weights_only=False)
    assert [row["val/acc"] for row in checkpoint["history"]] == [r["val/acc"] for r in records]
    assert checkpoint["config"]["model"]["value_dropout"] == 0.6

    events = EventAccumulator(str(out / "seed0"))
    events.Reload()
    assert keys <= set(events.Tags()["scalars"])
    val_acc = events.Scalars("val/acc")
    assert [e.step for e in val_acc] == list(range(1, 6))
    assert [e.value for e in val_acc] == pytest.approx([r["val/acc"] for r in records])


def test_overrides_may_come_between_options():
    args = train.parse_args(["--dataset", "Cora", "--no-progress", "optim.lr=0.01", "--seeds", "2", "kl.weight=0.5"])
    assert args.overrides == ["optim.lr=0.01", "kl.weight=0.5"] and args.seeds == 2 and args.dataset == "Cora"


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "0"], "error: seeds=0: expected a number >= 1"),
    (["--seeds", "-1"], "error: seeds=-1: expected a number >= 1"),
    (["kl.weight=abc"], "error: command line: kl.weight='abc': expected a number (float) like 0.0, got a string"),
    (["optim.lr="], "error: command line: optim.lr=: expected a number (float) like 0.005, got nothing"),
    (["--config", "missing.yaml"], "error: --config missing.yaml: no such file"),
])
def test_bad_command_lines_give_one_line_errors_and_write_nothing(argv, message, tmp_path, capsys):
    assert train.main([*argv, "--out", str(tmp_path / "run")]) == 2
    captured = capsys.readouterr()
    assert captured.err == message + "\n" and captured.out == ""
    assert not (tmp_path / "run").exists()


def test_demo_dataset_trains_and_evaluates_without_data(tmp_path, monkeypatch, capsys):
    """``--dataset demo``: the synthetic graph of graphattn.fixtures, no data root, far above chance."""
    monkeypatch.delenv("ATTN_DATA_ROOT", raising=False)
    out = tmp_path / "demo"
    assert train.main(["--dataset", "demo", "--attention", "bam-wc", "--seeds", "1", "--out", str(out),
                       "--no-progress", "train.max_epochs=60"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["dataset"] == "Demo" and results["test_acc"]["mean"] > 50  # 5 classes: chance is 20%
    assert results["preset"] is None and results["preset_deviations"] == {}
    assert evaluate.main([str(out), "--out", str(tmp_path / "eval.json")]) == 0
    assert json.loads((tmp_path / "eval.json").read_text())["checkpoints"][0]["test"]["acc"] == \
        pytest.approx(results["test_acc"]["mean"] / 100)


def test_a_preset_with_a_conflicting_override_is_run_with_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ATTN_DATA_ROOT", raising=False)
    out = tmp_path / "official"
    assert train.main(["--dataset", "demo", "--attention", "softmax", "--seeds", "1", "--out", str(out),
                       "--no-progress", "preset=official", "optim.lr=0.01", "train.patience=2"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["preset"] == "official"
    assert results["preset_deviations"] == {"optim.lr": {"preset": 0.005, "run": 0.01}}
    assert "differs from preset=official in optim.lr=0.01 (preset: 0.005)" in capsys.readouterr().err


@pytest.mark.parametrize("weight, frozen", [(0.0, True), (0.1, False)])
def test_a_run_without_the_kl_freezes_the_contextual_priors(tmp_path, weight, frozen):
    """Only the KL trains BAM's contextual prior: without it the prior is frozen, so that DDP (``--loader neighbor``
    under torchrun) does not wait for its gradient."""
    from common.utils.runtime import Runtime
    from graphattn.training import GATTask

    from .probes import synthetic_graph

    cfg = load_config("cora", "bam-wc", [f"kl.weight={weight}", "model.hidden_channels=4", "model.heads=2"])
    task = GATTask(cfg, synthetic_graph(), 0, tmp_path / "seed0", Runtime(torch.device("cpu")))
    priors = [p for name, p in task.model.named_parameters() if ".prior_net." in name]
    assert priors and all(p.requires_grad is not frozen for p in priors)
    assert all(p.requires_grad for name, p in task.model.named_parameters() if ".prior_net." not in name)
