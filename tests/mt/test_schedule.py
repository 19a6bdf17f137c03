"""Learning-rate schedules of mt.schedule (python -m mt.train): inverse square root with warm-up, plateau halving."""
import math

import pytest
import torch

from mt.schedule import LRSchedule


def optimizer():
    return torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1.0)


def test_inverse_sqrt_warms_up_linearly_then_decays():
    s = LRSchedule(optimizer(), "inverse_sqrt", base_lr=5e-4, warmup=4000)
    assert s.lr(1) == pytest.approx(5e-4 / 4000)
    assert s.lr(2000) == pytest.approx(2.5e-4)
    assert s.lr(4000) == pytest.approx(5e-4)
    assert s.lr(16000) == pytest.approx(2.5e-4)
    assert s.before_update(16000) == pytest.approx(2.5e-4)
    assert s.optimizer.param_groups[0]["lr"] == pytest.approx(2.5e-4)


def test_plateau_halves_when_perplexity_gets_worse_from_the_start_validation_on():
    s = LRSchedule(optimizer(), "plateau", base_lr=1e-3, plateau_factor=0.5, plateau_start=2)
    for ppl in (30.0, 20.0, 21.0, 19.0, 19.5):
        s.after_validation(ppl)
    assert s.lr(100) == pytest.approx(1e-3 * 0.25)  # halved after 21 > 20 and 19.5 > 19
    restored = LRSchedule(optimizer(), "plateau", base_lr=1e-3)
    restored.load_state_dict(s.state_dict())
    assert restored.lr(1) == s.lr(1) and restored.last_ppl == 19.5
    first = LRSchedule(optimizer(), "plateau", base_lr=1e-3, plateau_start=2)
    first.after_validation(math.inf)
    assert first.lr(1) == 1e-3  # the first validation never halves


def test_unknown_schedule_is_an_error():
    with pytest.raises(ValueError, match="schedule.kind"):
        LRSchedule(optimizer(), "cosine", base_lr=1.0)
