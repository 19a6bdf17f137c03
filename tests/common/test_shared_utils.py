"""common.utils and common.metrics as graphattn uses them (candidates to move to tests/common)."""
import json
import os
import stat

import pytest
import torch

from common.metrics import expected_calibration_error, pavpu_entropy, pavpu_ttest, ttest_uncertain
from common.utils import atomic_save, atomic_save_figure, atomic_write_json, results_record, seed_everything


def test_atomic_writes_replace_and_leave_no_temporary_files(tmp_path):
    path = tmp_path / "sub" / "results.json"
    atomic_write_json(path, {"a": 1})
    atomic_write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    atomic_save({"w": torch.ones(2)}, tmp_path / "sub" / "ckpt.pt")
    assert sorted(p.name for p in path.parent.iterdir()) == ["ckpt.pt", "results.json"]


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "results.json"
    atomic_write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


@pytest.fixture
def umask():
    """``umask(value)`` sets the process umask for the test; the old one is restored afterwards."""
    before = os.umask(0o022)
    yield os.umask
    os.umask(before)


def test_atomic_writes_get_the_umask_mode_like_any_new_file(tmp_path, umask):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def modes(directory):
        atomic_write_json(directory / "results.json", {"a": 1})
        atomic_save({"w": torch.ones(2)}, directory / "ckpt.pt")
        atomic_save_figure(plt.figure(figsize=(1, 1)), directory / "curves.png")
        with open(directory / "metrics.jsonl", "w"):  # what a plain open gives, as MetricsLogger writes
            pass
        return {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}

    umask(0o022)
    assert modes(tmp_path / "shared") == dict.fromkeys(["results.json", "ckpt.pt", "curves.png", "metrics.jsonl"],
                                                       0o644)
    umask(0o077)
    assert set(modes(tmp_path / "private").values()) == {0o600}


def test_a_write_that_fails_midway_leaves_no_temporary_file(tmp_path):
    atomic_save({"w": torch.ones(2)}, tmp_path / "ckpt.pt")
    with pytest.raises(Exception):
        atomic_save({"f": lambda: None}, tmp_path / "ckpt.pt")  # a lambda does not pickle
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"] and torch.load(tmp_path / "ckpt.pt")["w"].sum() == 2


def test_results_record_has_config_versions_and_commit_field():
    record = results_record({"lr": 0.1}, acc=0.5)
    assert record["acc"] == 0.5 and record["config"] == {"lr": 0.1}
    assert record["environment"]["packages"]["torch"] == torch.__version__
    assert "git_commit" in record["environment"]


def test_git_commit_is_the_one_the_copier_names_where_given(tmp_path, monkeypatch):
    from common.utils.results import git_commit

    monkeypatch.delenv("ATTN_SOURCE_COMMIT", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # git looks no higher than tmp_path
    assert git_commit(tmp_path) is None
    assert git_commit() not in (None, "12e02d8")  # inside the checkout, git answers
    monkeypatch.setenv("ATTN_SOURCE_COMMIT", "12e02d8")
    assert git_commit(tmp_path) == git_commit() == "12e02d8"


def test_seed_everything_repeats_draws():
    seed_everything(3)
    first = torch.rand(3)
    seed_everything(3)
    assert torch.equal(torch.rand(3), first)


def mc_logits():
    """Three predictions over 3 classes, 6 MC samples: a confident right one, a confident wrong
    one and a coin flip between classes 0 and 1 (wrong on average)."""
    noise = torch.tensor([0.1, -0.1, 0.2, -0.2, 0.05, -0.05])
    confident = torch.stack([torch.tensor([5.0, 0.0, -1.0]) + n for n in noise])
    flip = torch.stack([torch.tensor([1.0 if i % 2 else 0.0, 0.0 if i % 2 else 1.05, -3.0]) for i in range(6)])
    return torch.stack([confident, confident, flip], dim=1), torch.tensor([0, 2, 0])


def test_ttest_pavpu_counts_certain_right_and_uncertain_wrong():
    logits, targets = mc_logits()
    assert ttest_uncertain(logits).tolist() == [False, False, True]
    # accurate & certain (node 0) + inaccurate & uncertain (node 2), of 3.
    assert pavpu_ttest(logits, targets) == pytest.approx(2 / 3)


def test_ttest_constant_differences_are_certain_unless_tied():
    logits = torch.tensor([[[2.0, 1.0], [1.0, 1.0]]]).expand(4, 2, 2)
    assert ttest_uncertain(logits).tolist() == [False, True]


def test_entropy_pavpu_uses_the_threshold():
    logits, targets = mc_logits()
    assert pavpu_entropy(logits, targets, threshold=0.5) == pytest.approx(2 / 3)
    assert pavpu_entropy(logits, targets, threshold=10.0) == pytest.approx(1 / 3)


def test_expected_calibration_error():
    probs = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4], [0.6, 0.4]])
    targets = torch.tensor([0, 1, 0, 0])
    # Bin 0.9: accuracy 0.5, confidence 0.9; bin 0.6: accuracy 1.0, confidence 0.6.
    assert expected_calibration_error(probs, targets) == pytest.approx(0.5 * 0.4 + 0.5 * 0.4)


def test_full_batches_counts_each_process_share_and_refuses_an_epoch_without_update():
    from common.utils.updates import full_batches

    assert full_batches(50, 10, "questions") == 5 and full_batches(29, 5, "questions", processes=2) == 3
    with pytest.raises(ValueError, match=r"^an epoch would make no update: train.batch_size=8 exceeds the 7 "
                                         r"questions per process .*; set train.batch_size=7 or less$"):
        full_batches(13, 8, "questions", processes=2)
    with pytest.raises(ValueError, match="^an epoch would make no update: there are no questions; "):
        full_batches(0, 8, "questions")
