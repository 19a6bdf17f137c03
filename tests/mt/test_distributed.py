"""Data-parallel translation training: exact sharding of token-budget batches, and two gloo
processes following one process that accumulates the same batches."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from common.utils.distributed import DistEnv, round_robin

from .test_cli import TINY

ROOT = Path(__file__).resolve().parents[2]


def test_round_robin_deals_every_batch_exactly_once():
    items = list(range(23))
    for world, per_process in ((1, 1), (2, 1), (3, 2), (4, 3), (8, 5)):
        for start in (0, 5):
            seen, rounds = [], set()
            for rank in range(world):
                positions = []
                for position, mine in round_robin(items, DistEnv(rank=rank, world_size=world), start, per_process):
                    assert len(mine) <= per_process
                    seen += mine
                    positions.append(position)
                rounds.add(tuple(positions))
            assert sorted(seen) == items[start:], (world, per_process, start)  # none dropped, none repeated
            assert len(rounds) == 1  # every process steps through the same rounds
            assert positions[-1] == len(items)


def _train(tiny_root, prep, out, processes, update_freq, steps):
    args = ["-m", "mt.train", "--preset", "lstm-cpu", "--out", str(out), "--data-root", str(tiny_root),
            f"prepared_dir={prep}", *TINY, f"train.max_steps={steps}", f"batching.update_freq={update_freq}",
            "model.dropout=0", "train.eval_every=0", "train.max_epochs=1", "eval.beam=1",
            "batching.max_tokens=130"]  # 9 batches: the last round is uneven
    launcher = [sys.executable] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    # a session of its own, so that a timeout ends the launcher's worker processes too
    with subprocess.Popen(launcher + args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as process:
        try:
            _, stderr = process.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    assert process.returncode == 0, stderr[-3000:]
    return stderr


def test_two_processes_follow_one_process_accumulating_their_batches(tiny_root, tmp_path):
    prep = tmp_path / "prep"
    one = _train(tiny_root, prep, tmp_path / "one", 1, 2, steps=100)
    _train(tiny_root, prep, tmp_path / "two", 2, 1, steps=100)
    a, b = (torch.load(sorted((tmp_path / run / "checkpoints").iterdir())[-1], weights_only=False)
            for run in ("one", "two"))
    # one epoch of 9 batches: four rounds of 2, then 1 (the second process contributes nothing to it)
    assert a["step"] == b["step"] == 5 and a["extra"]["engine"]["epoch"] == b["extra"]["engine"]["epoch"] == 1
    for name in a["model"]:
        torch.testing.assert_close(b["model"][name], a["model"][name], rtol=1e-4, atol=1e-5)
    assert "resuming" not in one
