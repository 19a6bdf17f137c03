"""A training step reads nothing back to the host, checked without a GPU: each model x normalizer of
``tests/gpu/test_compile_cuda.py`` runs one step on the ``meta`` device, which the library treats as a GPU
(:func:`tests.host_reads.meta_as_gpu`), and :class:`tests.host_reads.HostReads` records every ``.item()``,
``bool(t)``, host-to-device copy and value-sized operator in it. The GAT is left out (its graph preparation
reads values by design and its sparse structures have no ``meta`` kernels): the GPU test covers it."""
import pytest
import torch

from .compile_cases import NORMALIZERS, build, training_step
from .host_reads import HostReads, meta_as_gpu

MODELS = ("mcan", "lxmert", "att2in", "mt-transformer")


@pytest.mark.parametrize("normalizer", NORMALIZERS)
@pytest.mark.parametrize("model_name", MODELS)
def test_a_training_step_reads_nothing_back(model_name, normalizer, monkeypatch):
    with meta_as_gpu(monkeypatch):
        model, inputs, loss = build(model_name, normalizer, device="meta")
        step = training_step(model, loss)
        reads = HostReads()
        with reads:
            step(*inputs).backward()
    assert not reads.found, reads.report()


def test_the_check_sees_host_reads_and_copies(monkeypatch):
    with meta_as_gpu(monkeypatch):
        x = torch.ones(3, device="meta")
        mask = torch.ones(3, dtype=torch.bool, device="meta")
        cases = {
            "new_tensor": lambda: torch.where(mask, x, x.new_tensor(0.0)),
            "tensor": lambda: torch.tensor([1.0], device=x.device),
            "to": lambda: torch.ones(3).to(x.device),
            "item": lambda: x.sum().item(),
            "bool": lambda: bool(x.sum() > 0),
            "nonzero": lambda: mask.nonzero(),
            "repeat_interleave": lambda: x.repeat_interleave(torch.ones(3, dtype=torch.long, device="meta")),
        }
        for name, case in cases.items():
            reads = HostReads()
            with reads:
                try:
                    case()
                except (RuntimeError, NotImplementedError):  # meta cannot compute values: recorded first
                    pass
            assert reads.found, name
        reads = HostReads()
        with reads:  # what the library does instead
            torch.where(mask, x, 0.0), torch.full((1,), 1.0, device=x.device), x.new_full((), 2.0)
        assert not reads.found, reads.report()
