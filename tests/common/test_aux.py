"""The auxiliary-loss collector, the KL schedules and the registry."""
import math

import pytest
import torch
from torch import nn

from common import attention


class TinyHost(nn.Module):
    """A host model whose forward signature knows nothing of auxiliary losses."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.norm1 = attention.build("bam-wc", key_dim=4)
        self.norm2 = attention.build("bam-wf")

    def forward(self, x):
        h = self.proj(x)
        scores = h @ h.transpose(-1, -2)
        w = self.norm1(scores, keys=h)
        return self.norm2(w @ h @ h.transpose(-1, -2)) @ h


def test_collector_gathers_every_layer_and_keeps_gradients():
    torch.manual_seed(0)
    model = TinyHost().train()
    x = torch.randn(3, 5, 4)
    with attention.aux_losses() as aux:
        out = model(x)
    assert len(aux) == 2 and set(aux.by_name()) == {"bam_kl"}
    terms = [value for _, value in aux.terms]
    assert torch.allclose(aux.total(), terms[0] + terms[1])
    assert torch.allclose(aux.total({"bam_kl": 0.25}), 0.25 * (terms[0] + terms[1]))
    (out.sum() + aux.total()).backward()
    assert model.proj.weight.grad is not None


def test_no_collection_outside_the_block_and_no_stale_terms():
    model = TinyHost().train()
    x = torch.randn(2, 5, 4)
    assert not attention.collecting()
    model(x)  # nothing collected, nothing raised
    with attention.aux_losses() as first:
        model(x)
    with attention.aux_losses() as second:
        pass
    assert len(first) == 2 and len(second) == 0
    assert float(second.total()) == 0.0


def test_a_disabled_block_yields_none_and_collects_nothing_even_inside_an_open_one():
    model = TinyHost().train()
    with attention.aux_losses(enabled=False) as off:
        assert off is None and not attention.collecting()
        model(torch.randn(2, 5, 4))
    with attention.aux_losses() as outer:
        with attention.aux_losses(False) as off:
            assert off is None and attention.collecting()  # the open block still collects what runs inside
            model(torch.randn(2, 5, 4))
    assert len(outer) == 2 and not attention.collecting()


def test_innermost_block_collects():
    model = TinyHost().train()
    with attention.aux_losses() as outer:
        with attention.aux_losses() as inner:
            model(torch.randn(2, 5, 4))
        model(torch.randn(2, 5, 4))
    assert len(inner) == 2 and len(outer) == 2


def test_mc_sampling_keeps_dropout_on_request_and_restores():
    model = nn.Sequential(nn.Dropout(0.5), attention.build("bam-wf")).eval()
    with attention.mc_sampling(model, dropout=True):
        assert model[0].training and model[1].mc_sampling and model[1].sampling
    assert not model[0].training and not model[1].mc_sampling and not model[1].sampling


def test_kl_schedule_from_a_config_kl_block():
    from omegaconf import OmegaConf

    kl = OmegaConf.create({"weight": 0.1, "schedule": "sigmoid", "warmup": 0, "rate": 2.0, "offset": 3.0})
    assert attention.KLSchedule.from_config(kl) == attention.KLSchedule(weight=0.1, kind="sigmoid", rate=2.0,
                                                                        offset=3.0)
    with pytest.raises(ValueError, match="warmup"):
        attention.KLSchedule.from_config({**kl, "schedule": "linear"})


def test_kl_schedules():
    const = attention.KLSchedule(weight=0.5)
    assert const(0) == const(100) == 0.5
    linear = attention.KLSchedule(weight=2.0, kind="linear", warmup=10)
    assert [linear(t) for t in (0, 5, 10, 50)] == [0.0, 1.0, 2.0, 2.0]
    sigmoid = attention.KLSchedule(weight=1.0, kind="sigmoid", rate=0.5)
    assert sigmoid(0) == 0.5  # the BAM GAT schedule starts at half weight
    assert math.isclose(sigmoid(4), 1 / (1 + math.exp(-2)))
    with pytest.raises(ValueError, match="warmup"):
        attention.KLSchedule(kind="linear")
    with pytest.raises(ValueError, match="kind"):
        attention.KLSchedule(kind="cosine")


def test_registry_rejects_duplicates_and_lists_variants():
    assert {"softmax", "bam-wf", "bam-wc", "bam-lf", "bam-lc", "entmax", "entmax15", "sparsemax"} <= set(attention.available())
    with pytest.raises(ValueError, match="already registered"):
        attention.register("softmax", attention.Softmax)
