"""Mini-batch training with PyG's NeighborLoader (graphattn.minibatch, ``loader.kind=neighbor``)."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch_geometric.typing

from common import attention
from common.utils.distributed import DistEnv
from graphattn import GAT, layerwise, minibatch, train, training
from graphattn.fixtures import demo_graph
from graphattn.config import load_config

NEEDS_SAMPLER = pytest.mark.skipif(
    not (torch_geometric.typing.WITH_TORCH_SPARSE or torch_geometric.typing.WITH_PYG_LIB),
    reason="needs torch-sparse or pyg-lib (the 'sampler' extra)")


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_global_batches_tile_one_permutation_with_equal_step_counts(world_size):
    """Every process takes as many steps; together they take each global batch once, in the order one process
    takes it; a new epoch is a new order, the same on every process."""
    per_rank = [minibatch.global_batches(23, 8, DistEnv(rank=r, world_size=world_size), seed=3, epoch=0)
                for r in range(world_size)]
    single = minibatch.global_batches(23, 8, DistEnv(), seed=3, epoch=0)
    assert {len(p) for p in per_rank} == {3}
    joined = [sum((p[step] for p in per_rank), []) for step in range(3)]
    assert joined == single
    assert sorted(sum(joined, [])) == list(range(23))
    assert minibatch.global_batches(23, 8, DistEnv(), seed=3, epoch=1) != joined


def test_a_last_batch_smaller_than_the_world_is_dropped_everywhere():
    shares = [minibatch.global_batches(9, 4, DistEnv(rank=r, world_size=2), seed=0, epoch=0) for r in range(2)]
    assert [len(s) for s in shares] == [2, 2] and sorted(sum(shares[0] + shares[1], [])) != list(range(9))
    with pytest.raises(ValueError, match="at least the number of processes"):
        minibatch.global_batches(9, 1, DistEnv(rank=0, world_size=2), seed=0, epoch=0)


@NEEDS_SAMPLER
def test_each_process_samples_around_its_own_share_of_seeds():
    data = demo_graph()
    seeds = data.train_mask.nonzero().view(-1)
    ranks = [minibatch.NeighborBatches(data, [3, 3], 40, DistEnv(rank=r, world_size=2), seed=0) for r in range(2)]
    per_rank = [[batch.n_id[:batch.batch_size].tolist() for batch in share.epoch(0)[:]] for share in ranks]
    assert [len(batch) for batch in per_rank[0]] == [20, 20, 20]  # 120 training nodes: 3 global batches of 40
    assert not set(sum(per_rank[0], [])) & set(sum(per_rank[1], []))
    assert sorted(sum(per_rank[0] + per_rank[1], [])) == seeds.tolist()


@pytest.mark.parametrize("fanouts", [[10], [0, 5], [10, -2], [2.5, 3]])
def test_bad_fanouts_are_a_clear_error(fanouts):
    with pytest.raises(ValueError, match="one count per layer"):
        minibatch.check_fanouts(fanouts, num_layers=2)


def test_without_a_sampler_the_cli_says_what_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch_geometric.typing, "WITH_TORCH_SPARSE", False)
    monkeypatch.setattr(torch_geometric.typing, "WITH_PYG_LIB", False)
    cfg = load_config("Cora", None, ["loader.kind=neighbor", f"out_dir={tmp_path}", "seeds=1"])
    with pytest.raises(minibatch.SamplerMissing, match=r'pip install --no-build-isolation -e "\.\[sampler\]"'):
        training.run(cfg, progress=False, data=demo_graph())


@NEEDS_SAMPLER
@pytest.mark.parametrize("name", ["softmax", "bam-wc"])
def test_layerwise_inference_equals_the_full_batch_forward(name):
    data = demo_graph()
    model = GAT(16, 5, hidden_channels=4, heads=3, attention=name).eval()
    expected = model(data.x, data.edge_index)
    out = model.inference(data.x, layerwise.inference_loader(data, batch_size=37))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@NEEDS_SAMPLER
@pytest.mark.parametrize("name", attention.available())
def test_neighbor_training_learns_with_every_normalizer(name, tmp_path):
    cfg = load_config("Cora", name, ["loader.kind=neighbor", "loader.batch_size=32", "loader.num_neighbors=[5,5]",
                                     "seeds=1", "train.max_epochs=15", "train.patience=15", f"out_dir={tmp_path}",
                                     "kl.weight=0.1", "train.sparse_features=false", "optim.lr=0.01",
                                     "model.dropout=0.2", "model.value_dropout=0"])  # 0.6 stalls sparsemax on 120 nodes
    results = training.run(cfg, progress=False, data=demo_graph())
    history = [json.loads(line) for line in (tmp_path / "seed0" / "metrics.jsonl").read_text().splitlines()]
    assert len(history) == 15
    assert history[-1]["train/ce"] < history[0]["train/ce"]
    assert results["test_acc"]["mean"] > 40  # 5 classes: chance is 20%
    if name.startswith("bam"):
        assert all(row["train/kl"] > 0 for row in history)


@NEEDS_SAMPLER
def test_a_batch_of_every_node_has_the_full_batch_loss_and_kl():
    """With every node a seed and full neighbourhoods, the sampled subgraph is the whole graph (relabelled):
    the mini-batch step's BAM KL (each layer's mean over the edges it attends over) is the full-batch step's."""
    data = demo_graph()
    data.train_mask[:] = True
    (batch,) = minibatch.NeighborBatches(data, [-1, -1], data.num_nodes, DistEnv(), seed=0).epoch(0)[:]
    assert batch.batch_size == data.num_nodes and batch.edge_index.size(1) == data.edge_index.size(1)
    model = GAT(16, 5, hidden_channels=4, heads=3, dropout=0.0, attention="bam-wc").train()
    kls = []
    for x, edge_index in ((data.x, data.edge_index), (batch.x, batch.edge_index)):
        with attention.aux_losses() as aux:
            model(x, edge_index)
        kls.append([value for name, value in aux.terms if name == "bam_kl"])
    full, sampled = kls
    assert len(full) == len(sampled) == 2 and full[0] > 0
    torch.testing.assert_close(sampled[0], full[0])  # layer 1 reads the inputs: the same scores, the same KL
    # Layer 2's scores read layer 1's BAM samples, drawn in the subgraph's node order: close, not equal.
    torch.testing.assert_close(sampled[1], full[1], rtol=1e-3, atol=0)


@pytest.mark.realdata
@NEEDS_SAMPLER
def test_two_processes_take_the_steps_of_one_on_the_global_batch(attn_data_root, tmp_path):
    """torchrun with 2 gloo processes and global batch 64 (3 steps an epoch on Cora's 140 training nodes) against
    one process: same curves, same weights (softmax, no dropout, full neighbourhoods: nothing random)."""
    def train_with(processes, out):
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)] \
            if processes > 1 else [sys.executable]
        cmd = [*launch, "-m", "graphattn.train", "--dataset", "Cora", "--data-root", str(attn_data_root),
               "--out", str(out), "--seeds", "1", "--no-progress", "--loader", "neighbor", "--num-neighbors", "-1",
               "-1", "--batch-size", "64", "--device", "cpu", "model.dropout=0", "model.value_dropout=0",
               "train.max_epochs=4", "train.sparse_features=false"]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        return torch.load(out / "seed0.pt", map_location="cpu", weights_only=False)

    ddp, single = train_with(2, tmp_path / "ddp"), train_with(1, tmp_path / "single")
    for mine, theirs in zip(single["history"], ddp["history"]):
        assert mine.keys() == theirs.keys()
        for key in mine:
            assert theirs[key] == pytest.approx(mine[key], rel=1e-4, abs=1e-6), key
    for name, value in single["model_state"].items():
        torch.testing.assert_close(ddp["model_state"][name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert ddp["config"]["loader"]["batch_size"] == 64


def test_cli_refuses_a_fanout_per_layer_mismatch_before_loading_data(tmp_path, capsys):
    argv = ["--dataset", "Cora", "--loader", "neighbor", "--num-neighbors", "10", "--out", str(tmp_path), "--seeds", "1",
            "--data-root", str(tmp_path), "--no-progress"]
    assert train.main(argv) == 2
    assert "loader.num_neighbors must give one count per layer (2)" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
