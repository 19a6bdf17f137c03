"""``tagging.training.run`` on a tiny written treebank: the protocol's records, an exact resume after Ctrl-C,
finished seeds reused, a changed config refused."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from common.utils.checkpoint import Checkpointer

from tagging import training
from tagging.config import load_config

from tagging.fixtures import write_toy_treebank

PER_EPOCH = 8   # 30 training sentences in batches of 4


def config(treebank: Path, out: Path, *extra: str):
    return load_config([f"treebank={treebank}", f"data_root={treebank.parent}", f"out_dir={out}", "seeds=1",
                        "device=cpu", "model.word_dim=16", "model.char_dim=8", "model.layers=2", "model.heads=2",
                        "data.max_len=12", "train.batch_size=4", "train.max_epochs=3", "train.patience=100",
                        "train.curve_every=3", "train.num_threads=1", *extra])


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """One uninterrupted run: (treebank directory, run directory, record)."""
    threads = torch.get_num_threads()
    root = tmp_path_factory.mktemp("tagging-run")
    treebank = write_toy_treebank(root / "UD_Toy-Tiny")
    record = training.run(config(treebank, root / "straight"), progress=False)
    torch.set_num_threads(threads)
    return treebank, root / "straight", record


def without_time(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "train_seconds"}


def test_an_uninterrupted_run_records_the_protocol(baseline):
    _, out, record = baseline
    assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(record))
    assert (out / "curves.png").stat().st_size > 0 and (out / "seed0" / "best.pt").exists()
    assert record["counts"] == {"train": {"sentences": 30, "words": record["counts"]["train"]["words"]},
                                "dev": {"sentences": 6, "words": record["counts"]["dev"]["words"]},
                                "test": {"sentences": 6, "words": record["counts"]["test"]["words"]}}
    (seed,) = record["per_seed"]
    assert (seed["seed"], seed["epochs"], seed["updates"], seed["updates_per_epoch"]) == (0, 3, 24, PER_EPOCH)
    curve = seed["curve"]
    # every 3 updates within the first epoch (not at its last update), then every epoch's end
    assert [(p["step"], p["epoch_end"]) for p in curve] == [(3, False), (6, False), (8, True), (16, True), (24, True)]
    assert [p["epoch"] for p in curve] == [3 / 8, 6 / 8, 1, 2, 3]
    ends = [p["dev_acc"] for p in curve if p["epoch_end"]]
    assert seed["best_epoch"] == 1 + ends.index(max(ends)) and seed["dev"]["all"] == max(ends)
    assert seed["dev_acc_after_1_epoch"] == ends[0]
    assert record["test"]["all"] == {"mean": seed["test"]["all"], "std": 0.0, "n": 1}
    assert seed["test"]["words"] == record["counts"]["test"]["words"] and seed["test"]["oov_words"] > 0


def _compare(record: dict, reference: dict, run_dir: Path, reference_dir: Path) -> None:
    assert record["test"] == reference["test"] and record["dev"] == reference["dev"]
    assert [without_time(r) for r in record["per_seed"]] == [without_time(r) for r in reference["per_seed"]]
    best, ref = (torch.load(d / "seed0" / "best.pt", weights_only=False) for d in (run_dir, reference_dir))
    assert best["epoch"] == ref["epoch"] and best["model"].keys() == ref["model"].keys()
    for name, value in ref["model"].items():
        assert torch.equal(best["model"][name], value), name


@pytest.mark.parametrize("interrupt_at", [
    PER_EPOCH + 3,   # the middle of epoch 2
    5,               # the middle of epoch 1, between two points of the learning curve
    PER_EPOCH,       # the last update of epoch 1: the resumed epoch has no batch left, only its end
])
def test_ctrl_c_and_a_rerun_give_the_uninterrupted_results(baseline, tmp_path, ctrl_c_on_call, interrupt_at):
    treebank, straight, reference = baseline
    cfg = config(treebank, tmp_path / "run")
    restore = ctrl_c_on_call(training.TaggingTask, "train_step", interrupt_at)
    with pytest.raises(KeyboardInterrupt):
        training.run(cfg, progress=False)
    restore()
    path = Checkpointer(tmp_path / "run" / "seed0").paths()[-1]
    saved = torch.load(path, weights_only=False)["extra"]["engine"]
    # the update in progress finished before the checkpoint was written
    epoch = (interrupt_at - 1) // PER_EPOCH
    assert (saved["step"], saved["epoch"], saved["batch"]) == (interrupt_at, epoch, interrupt_at - PER_EPOCH * epoch)
    assert not (tmp_path / "run" / "seed0.json").exists() and not (tmp_path / "run" / "results.json").exists()
    record = training.run(cfg, progress=False)
    _compare(record, reference, tmp_path / "run", straight)


def test_a_finished_seed_is_reused_and_resumable_keys_may_change(baseline, tmp_path, monkeypatch):
    treebank, straight, reference = baseline
    shutil.copytree(straight, tmp_path / "run")

    def retrain(*args, **kwargs):
        raise AssertionError("a finished seed was trained again")

    monkeypatch.setattr(training.TaggingTask, "__init__", retrain)
    record = training.run(config(treebank, tmp_path / "run", "device=auto", "train.num_threads=2"), progress=False)
    assert record["per_seed"] == reference["per_seed"] and record["test"] == reference["test"]


@pytest.mark.parametrize("change, listed", [("model.layers=3", "model.layers: 2 -> 3"),
                                            ("train.batch_size=5", "train.batch_size: 4 -> 5")])
def test_a_changed_config_refuses_to_resume_and_names_the_key(baseline, tmp_path, change, listed):
    treebank, straight, _ = baseline
    shutil.copytree(straight, tmp_path / "run")
    before = (tmp_path / "run" / "config.json").read_text()
    with pytest.raises(ValueError) as err:
        training.run(config(treebank, tmp_path / "run", change), progress=False)
    assert f"{tmp_path / 'run'} holds a run with a different config ({listed})" in str(err.value)
    assert (tmp_path / "run" / "config.json").read_text() == before


def test_early_stopping_stops_after_patience_epochs_without_a_better_dev_accuracy(tmp_path):
    treebank = write_toy_treebank(tmp_path / "UD_Toy-Tiny", seed=3)
    record = training.run(config(treebank, tmp_path / "run", "train.max_epochs=8", "train.patience=1",
                                 "optim.lr=0.05"), progress=False)
    (seed,) = record["per_seed"]
    ends = [p["dev_acc"] for p in seed["curve"] if p["epoch_end"]]
    assert len(ends) == seed["epochs"] and seed["updates"] == PER_EPOCH * seed["epochs"]
    # stopped at the first epoch that did not beat the best so far, or at max_epochs
    first_bad = next((i for i in range(1, len(ends)) if ends[i] <= max(ends[:i])), None)
    assert seed["epochs"] == (first_bad + 1 if first_bad is not None else 8)
    assert seed["best_epoch"] == 1 + ends.index(max(ends))


def test_a_preset_with_a_conflicting_override_is_run_and_its_deviations_recorded(baseline, tmp_path, capsys):
    """``--preset official model.init=torch``: taken, with one line saying what differs from the authors'
    setup, and the same in results.json (``preset_deviations``); the preset's own settings differ in nothing."""
    treebank, _, _ = baseline
    few = ("train.max_epochs=1",)
    official = load_config([f"treebank={treebank}", f"data_root={treebank.parent}", f"out_dir={tmp_path / 'a'}",
                            "seeds=1", "device=cpu", "model.layers=1", "model.heads=2", "data.max_len=12",
                            "train.batch_size=4", "train.num_threads=1", *few], preset="official")
    assert training.run(official, progress=False)["preset_deviations"] == {}
    changed = load_config([f"treebank={treebank}", f"data_root={treebank.parent}", f"out_dir={tmp_path / 'b'}",
                           "seeds=1", "device=cpu", "model.layers=1", "model.heads=2", "data.max_len=12",
                           "train.batch_size=4", "train.num_threads=1", "model.init=torch", *few],
                          preset="official")
    record = training.run(changed, progress=False)
    assert record["preset"] == "official"
    assert record["preset_deviations"] == {"model.init": {"preset": "keras", "run": "torch"}}
    assert "differs from --preset official in model.init=torch (preset: keras)" in capsys.readouterr().err
