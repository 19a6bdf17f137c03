"""A small synthetic citation-style graph for demos and tests: no download, a few seconds to train.

A stochastic block model (Holland et al., 1983): ``classes`` blocks of equal size, edges within a
block about ``homophily / (1 - homophily)`` times as likely as across, so that attention over
neighbours helps; node features are Gaussian noise plus a one-hot of the node's class; the split is
40/30/30 percent, as Planetoid-style ``train_mask``/``val_mask``/``test_mask``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.utils import stochastic_blockmodel_graph


def demo_graph(num_nodes: int = 300, classes: int = 5, features: int = 16, mean_degree: float = 6.0,
               homophily: float = 0.8, seed: int = 0) -> Data:
    """The demo graph (``python -m graphattn.train --dataset demo``): ``x``, ``edge_index``, ``y``, masks,
    ``num_classes``; the same graph for the same arguments."""
    generator = torch.Generator().manual_seed(seed)
    size = num_nodes // classes
    num_nodes = size * classes
    within = mean_degree * homophily / size
    across = mean_degree * (1 - homophily) / (num_nodes - size)
    probs = torch.full((classes, classes), across) + torch.eye(classes) * (within - across)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # stochastic_blockmodel_graph draws from the global generator
    edge_index = stochastic_blockmodel_graph([size] * classes, probs, directed=False)
    torch.random.set_rng_state(state)
    y = torch.arange(classes).repeat_interleave(size)
    x = torch.randn(num_nodes, features, generator=generator) + F.one_hot(y % features, features).float()
    data = Data(x=x, edge_index=edge_index, y=y, num_classes=classes)
    order = torch.randperm(num_nodes, generator=generator)
    for name, part in zip(("train_mask", "val_mask", "test_mask"),
                          order.tensor_split([int(0.4 * num_nodes), int(0.7 * num_nodes)])):
        data[name] = torch.zeros(num_nodes, dtype=torch.bool).index_fill_(0, part, True)
    return data
