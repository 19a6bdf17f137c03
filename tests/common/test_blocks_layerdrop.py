"""LayerDrop: random in training only; every-other pruning removes exactly the chosen layers."""
import pytest
import torch
from torch import nn

from common.attention.structure import LayerDropList, every_other_layers, prune_layers


class AddIndex(nn.Module):
    def __init__(self, index):
        super().__init__()
        self.index = index

    def forward(self, seen):
        return seen + [self.index]


def run(layers):
    seen = []
    for layer in layers:
        seen = layer(seen)
    return seen


def test_layerdrop_is_a_no_op_in_eval():
    layers = LayerDropList([AddIndex(i) for i in range(6)], p=0.9).eval()
    assert all(run(layers) == list(range(6)) for _ in range(20))


def test_layerdrop_drops_each_layer_independently_in_training():
    torch.manual_seed(0)
    layers = LayerDropList([AddIndex(i) for i in range(8)], p=0.5).train()
    runs = [run(layers) for _ in range(400)]
    kept = torch.tensor([[i in r for i in range(8)] for r in runs], dtype=torch.float)
    assert torch.allclose(kept.mean(0), torch.full((8,), 0.5), atol=0.1)
    assert len({tuple(r) for r in runs}) > 50  # not one fixed subset
    assert all(r == sorted(r) for r in runs)  # order is kept
    assert run(LayerDropList([AddIndex(i) for i in range(3)], p=0.0).train()) == [0, 1, 2]


def test_layerdrop_keeps_parameters_registered():
    layers = LayerDropList([nn.Linear(2, 2) for _ in range(3)], p=0.5)
    assert len(list(layers.parameters())) == 6 and len(layers.state_dict()) == 6
    with pytest.raises(ValueError, match="p must be in"):
        LayerDropList([], p=1.0)


def test_every_other_rule():
    assert every_other_layers(6) == [0, 2, 4]
    assert every_other_layers(5) == [0, 2, 4]
    assert every_other_layers(8, rate=0.25) == [0, 1, 2, 4, 5, 6]
    with pytest.raises(ValueError, match="rate"):
        every_other_layers(6, rate=0.75)


def test_prune_removes_exactly_the_chosen_layers():
    layers = LayerDropList([AddIndex(i) for i in range(6)], p=0.2)
    pruned = prune_layers(layers, every_other_layers(6))
    assert isinstance(pruned, LayerDropList) and pruned.p == 0.2
    assert run(pruned.eval()) == [0, 2, 4]
    assert pruned[1] is layers[2]
    assert isinstance(layers[1:3], LayerDropList) and layers[1:3].p == 0.2
    assert run(prune_layers(nn.ModuleList(AddIndex(i) for i in range(6)), [1, 5])) == [1, 5]
    for bad in ([], [2, 2], [3, 1], [0, 6]):
        with pytest.raises(ValueError):
            prune_layers(layers, bad)


def test_pruning_an_evaluating_model_keeps_eval_mode_so_no_layer_is_dropped():
    layers = LayerDropList([AddIndex(i) for i in range(6)], p=0.9).eval()
    pruned = prune_layers(layers, every_other_layers(6))
    assert not pruned.training
    assert all(run(pruned) == [0, 2, 4] for _ in range(20))  # p=0.9 would drop nearly all in training
    assert prune_layers(layers.train(), [0, 1]).training
