"""A few GAT training epochs and an evaluation on a small synthetic graph, on any device and precision
(shared by the mixed-precision tests and the CUDA tests)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch_geometric.data import Data

from common.utils.runtime import Runtime
from graphattn.config import load_config
from graphattn.models import build_model, evaluate_split, prepare_features
from common.training import Engine
from graphattn.training import GATTask, plan_of

#: BAM-WC without dropout (its masks would be drawn differently in other dtypes and devices).
DETERMINISTIC = ["model.dropout=0", "model.value_dropout=0", "kl.weight=0.1", "kl.schedule=constant"]


def synthetic_graph(nodes: int = 60, features: int = 20, classes: int = 3, seed: int = 0) -> Data:
    """Class-dependent sparse features, mostly within-class edges, Planetoid-style masks."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (nodes,), generator=g)
    x = (torch.rand(nodes, features, generator=g) < 0.1).float()
    x[torch.arange(nodes), y] = 1.0
    src = torch.randint(0, nodes, (4 * nodes,), generator=g)
    same = torch.nonzero(y.unsqueeze(0) == y.unsqueeze(1))
    pick = same[torch.randint(0, len(same), (4 * nodes,), generator=g)]
    edge_index = torch.cat([torch.stack([src, torch.randint(0, nodes, (4 * nodes,), generator=g)]), pick.t()], 1)
    order = torch.randperm(nodes, generator=g)
    masks = [torch.zeros(nodes, dtype=torch.bool) for _ in range(3)]
    for mask, part in zip(masks, order.tensor_split(3)):
        mask[part] = True
    return Data(x=x, edge_index=edge_index, y=y, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                num_classes=classes)


def train_probe(device: str = "cpu", precision: str = "fp32", epochs: int = 8, attention: str = "bam-wc",
                extra=()) -> dict:
    """Per-epoch training loss of ``epochs`` epochs, then the test loss of the trained model."""
    cfg = load_config("cora", attention, [*DETERMINISTIC, f"train.max_epochs={epochs}", "train.patience=1000",
                                          "model.hidden_channels=4", "model.heads=2", *extra])
    runtime = Runtime(torch.device(device), precision)
    data = synthetic_graph().to(runtime.device)
    with tempfile.TemporaryDirectory() as out:
        task = GATTask(cfg, data, 0, Path(out) / "seed0", runtime)
        task.record(Engine(runtime, task.dir, plan_of(cfg), progress=False).fit(task))
        checkpoint = torch.load(Path(out) / "seed0.pt", map_location=runtime.device, weights_only=False)
    return {"losses": [row["train/loss"] for row in checkpoint["history"]],
            "eval": checkpoint["metrics"]["test"]["loss"], "checkpoint": checkpoint, "cfg": cfg, "data": data}


def evaluate_probe(checkpoint: dict, cfg, data: Data, device: str = "cpu", precision: str = "fp32") -> float:
    """Test loss of a ``train_probe`` checkpoint evaluated on ``device`` (wherever it was trained)."""
    runtime = Runtime(torch.device(device), precision)
    model = build_model(cfg, data.num_features, data.num_classes)
    model.load_state_dict(checkpoint["model_state"])
    data = data.to(runtime.device)
    model.to(runtime.device)
    return evaluate_split(model, prepare_features(data, cfg), data.edge_index, data.y, data.test_mask, runtime)["loss"]
