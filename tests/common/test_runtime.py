"""common.utils.runtime: device choice and its errors, autocast, the gradient scaler, moving batches;
normalizers in float32 under autocast; device-portable checkpoints; the --device option of every CLI."""
import dataclasses

import pytest
import torch
from torch import nn

from common import attention
from common.utils import Checkpointer
from common.utils.runtime import LSTM, DeviceError, Runtime, resolve_device

from ..runtime_checks import rewrite_as_written_on_cuda

NO_CUDA = not torch.cuda.is_available()


def test_auto_and_cpu_resolve_here():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    assert resolve_device(None) == resolve_device("auto")


@pytest.mark.parametrize("spec", ["cuda:99", "gpu", "cuda:x", "tpu:0"])
def test_unavailable_or_unknown_devices_are_one_line_errors(spec):
    with pytest.raises(DeviceError) as err:
        resolve_device(spec)
    assert spec in str(err.value) and "\n" not in str(err.value)


@pytest.mark.skipif(not NO_CUDA, reason="CUDA is available here")
def test_cuda_without_cuda_says_why_and_what_to_do():
    with pytest.raises(DeviceError, match="CUDA is not available.*use --device cpu"):
        resolve_device("cuda")


def test_unknown_precision_is_refused():
    with pytest.raises(DeviceError, match="train.precision='fp8'"):
        Runtime(torch.device("cpu"), "fp8")


def test_fp32_runs_without_autocast_and_bf16_with_it():
    layer = nn.Linear(4, 4)
    assert Runtime(torch.device("cpu")).dtype is None
    with Runtime(torch.device("cpu")).autocast():
        assert layer(torch.randn(2, 4)).dtype == torch.float32
    with Runtime(torch.device("cpu"), "bf16").autocast():
        assert layer(torch.randn(2, 4)).dtype == torch.bfloat16


def test_fp16_scaler_skips_overflowing_steps_and_unscales_before_clipping():
    torch.manual_seed(0)
    runtime = Runtime(torch.device("cpu"), "fp16")
    layer = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    seen = []

    def step():
        optimizer.zero_grad()
        with runtime.autocast():
            loss = layer(torch.full((1, 3), 0.01)).float().sum()
        runtime.backward_step(loss, optimizer, clip=lambda: seen.append(layer.weight.grad.clone()))

    before = layer.weight.detach().clone()
    step()  # dL/dy = 65536, the initial scale, overflows float16: the step is skipped and the scale halves
    assert torch.equal(layer.weight, before) and runtime.scaler.get_scale() == 32768.0
    step()
    # clip() sees the true gradient (0.01), not the scaled one (x 32768)
    torch.testing.assert_close(seen[-1], torch.full((1, 3), 0.01), rtol=1e-3, atol=0)
    assert not torch.equal(layer.weight, before)


@dataclasses.dataclass
class _Batch:
    src: torch.Tensor
    lengths: list


def test_to_device_walks_dicts_lists_and_dataclasses():
    runtime = Runtime(torch.device("cpu"))
    batch = {"a": torch.ones(2), "b": [torch.zeros(1), 3], "c": _Batch(torch.ones(1), [1, 2]), "d": "x"}
    moved = runtime.to_device(batch)
    assert moved["b"][1] == 3 and moved["d"] == "x" and moved["c"].lengths == [1, 2]
    assert isinstance(moved["c"], _Batch) and torch.equal(moved["c"].src, batch["c"].src)
    assert runtime.pin_memory is False


@pytest.mark.parametrize("name", attention.available())
def test_normalizers_compute_in_float32_under_autocast(name):
    """bf16 scores in, bf16 weights out, float32 KL; the weights equal the float32 computation on the
    same (bf16-rounded) scores up to bf16 rounding of the output, with exact zeros where masked."""
    torch.manual_seed(0)
    norm = attention.build(name, num_heads=2, key_dim=8).eval()
    scores = (torch.randn(2, 2, 5, 7) * 4).bfloat16()
    scores[0, 0, 0, 0] = 1e4  # extreme logits stay finite
    keys = torch.randn(2, 2, 7, 8).bfloat16()
    mask = torch.rand(2, 1, 5, 7) > 0.3
    mask[1, 0, 2] = False  # a fully masked row
    with attention.aux_losses() as ref_aux:
        reference = norm(scores.float(), mask=mask, keys=keys.float())
    with torch.autocast("cpu", dtype=torch.bfloat16), attention.aux_losses() as aux:
        weights = norm(scores, mask=mask, keys=keys)
    assert weights.dtype == torch.bfloat16 and torch.isfinite(weights).all()
    torch.testing.assert_close(weights.float(), reference, rtol=0, atol=4e-3)
    assert (weights[~mask.expand_as(weights)] == 0).all()
    for kl, ref in zip(aux.by_name().values(), ref_aux.by_name().values()):
        assert kl.dtype == torch.float32 and torch.equal(kl, ref)


def test_float64_scores_stay_float64():
    norm = attention.build("bam-wc", key_dim=4)
    scores, keys = torch.randn(3, 5, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert norm(scores, keys=keys).dtype == torch.float64


def test_checkpoints_written_on_a_gpu_resume_on_the_cpu(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    runtime = Runtime(torch.device("cpu"), "fp16")
    runtime.backward_step(model(torch.randn(4, 3)).sum() * float("inf"), optimizer)  # skipped: the scale halves
    assert runtime.scaler.get_scale() == 32768.0
    Checkpointer(tmp_path).save(0, model, optimizer, scaler=runtime.scaler)
    expected = torch.rand(3)  # the draw after the save
    assert rewrite_as_written_on_cuda(tmp_path) == 1
    fresh, fresh_scaler = nn.Linear(3, 2), Runtime(torch.device("cpu"), "fp16").scaler
    fresh_optimizer = torch.optim.Adam(fresh.parameters())
    state = Checkpointer(tmp_path).load_latest(fresh, fresh_optimizer, map_location="cpu", scaler=fresh_scaler)
    assert state["step"] == 0 and torch.equal(fresh.weight, model.weight)
    assert fresh_optimizer.state_dict()["state"][0]["exp_avg"].device.type == "cpu"
    assert fresh_scaler.get_scale() == 32768.0 and torch.equal(torch.rand(3), expected)


def test_lstm_runs_in_float32_under_cpu_autocast():
    torch.manual_seed(0)
    lstm = LSTM(6, 5, batch_first=True, bidirectional=True)
    x = torch.randn(3, 4, 6)
    expected, _ = lstm(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, (h, c) = lstm(x)
    assert out.dtype == h.dtype == torch.float32
    assert torch.equal(out, expected)
    assert set(lstm.state_dict()) == set(nn.LSTM(6, 5, bidirectional=True).state_dict())  # checkpoints unchanged


@pytest.mark.parametrize("value,mode", [(False, None), ("off", None), (True, "default"), ("default", "default"),
                                        ("max-autotune", "max-autotune")])
def test_compile_modes(value, mode):
    runtime = Runtime(torch.device("cpu"), compile_mode=value)
    assert runtime.compile_mode == mode and runtime.compiled == (mode is not None)
    assert runtime.describe()["compile"] == (mode or False) and not runtime.fixed_shapes


@pytest.mark.parametrize("value,message", [
    ("reduce-overhead", "train.compile=reduce-overhead records CUDA graphs and needs a CUDA device"),
    ("fast", "train.compile='fast': expected one of off, default, reduce-overhead, max-autotune")])
def test_bad_compile_modes_are_one_line_errors(value, message):
    with pytest.raises(DeviceError, match=message):
        Runtime(torch.device("cpu"), compile_mode=value)


def test_a_runtime_from_a_run_config_reads_its_keys_and_sets_the_threads():
    from omegaconf import OmegaConf

    before = torch.get_num_threads()
    try:
        cfg = OmegaConf.create({"device": "cpu", "train": {"precision": "bf16", "compile": "default",
                                                           "num_threads": 1}})
        runtime = Runtime.from_config(cfg)
        assert runtime.device == torch.device("cpu") and runtime.precision == "bf16"
        assert runtime.compile_mode == "default" and torch.get_num_threads() == 1
        no_compile_key = OmegaConf.create({"device": "cpu", "train": {"precision": "fp32", "num_threads": None}})
        assert Runtime.from_config(no_compile_key).compile_mode is None  # tagging and GLUE have no such key
    finally:
        torch.set_num_threads(before)
