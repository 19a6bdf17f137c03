"""Where and how a run computes: device, precision, compilation, threads and moving batches.

Every train, evaluate, translate and visualize CLI builds one :class:`Runtime` from the shared
``--device`` option and the ``train.precision`` / ``train.compile`` config keys::

    runtime = Runtime.from_config(cfg)               # device, train.precision, .compile, .num_threads
    model = build_model(cfg).to(runtime.device)
    forward = runtime.compile(model)                 # call this; checkpoints save ``model``
    for batch in loader:                             # DataLoader(..., pin_memory=runtime.pin_memory)
        batch = runtime.to_device(batch)
        with runtime.autocast():
            loss = criterion(forward(batch), ...)
        runtime.backward_step(loss, optimizer, clip=lambda: clip_grad_norm_(model.parameters(), 1.0))

* ``device``: ``auto`` (CUDA when available, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``.
  Under ``torchrun`` (``distributed=True``) ``auto`` and ``cuda`` mean the process's own GPU
  (``LOCAL_RANK``). Asking for CUDA where there is none raises :class:`DeviceError`, whose
  one-line message the CLIs print.
* ``precision``: ``fp32``, or ``bf16`` / ``fp16`` autocast (fp16 with a gradient scaler, whose
  state the checkpoints keep). On CUDA, float32 matrix products use TF32. The attention
  normalizers compute their softmax, noise and KL in float32 inside autocast
  (:class:`common.attention.Normalizer`).
* ``compile``: ``torch.compile`` of the model's forward (:func:`compile_model`) in one of
  :data:`COMPILE_MODES`: ``off`` (or false), ``default`` (or true), ``reduce-overhead`` (CUDA graphs:
  one launch of the whole step, for fixed shapes; CUDA only) or ``max-autotune``. The uncompiled module
  stays the one whose weights are saved, so checkpoints load with or without compilation.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch
from torch import nn

from .distributed import DistEnv, init_distributed

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
#: ``train.compile`` values: off, or a ``torch.compile`` mode (true and false are default and off).
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"


class DeviceError(ValueError):
    """The requested device or precision is not available here (a one-line message)."""


def _cuda_missing_reason() -> str:
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is a CPU-only build"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU"


def resolve_device(spec: Optional[str] = "auto", local_rank: int = 0) -> torch.device:
    """The device that ``spec`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``) names on this machine."""
    name = (spec or "auto").strip().lower()
    if name == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise DeviceError(f"--device {spec}: CUDA is not available ({_cuda_missing_reason()}); "
                              f"use --device cpu, or auto to take a GPU only when there is one")
        index = local_rank if name == "cuda" else name.split(":", 1)[1]
        if not str(index).isdigit():
            raise DeviceError(f"--device {spec}: expected {DEVICE_CHOICES}")
        count = torch.cuda.device_count()
        if int(index) >= count:
            raise DeviceError(f"--device {spec}: this machine has {count} GPU(s) (cuda:0 to cuda:{count - 1})")
        return torch.device(f"cuda:{index}")
    raise DeviceError(f"--device {spec!r}: expected {DEVICE_CHOICES}")


def compile_mode(value: Any, device: torch.device) -> Optional[str]:
    """The ``torch.compile`` mode that ``train.compile`` names (None for off); CUDA graphs need CUDA."""
    mode = "off" if value is None or value is False else "default" if value is True else str(value)
    if mode not in COMPILE_MODES:
        raise DeviceError(f"train.compile={value!r}: expected one of {', '.join(COMPILE_MODES)} (or true / false)")
    if mode == "reduce-overhead" and device.type != "cuda":
        raise DeviceError(f"train.compile=reduce-overhead records CUDA graphs and needs a CUDA device, not {device}; "
                          "use train.compile=default")
    return None if mode == "off" else mode


def compile_model(model, mode: Optional[str] = None, fullgraph: bool = False):
    """``torch.compile(model, mode=mode, fullgraph=fullgraph)`` with Dynamo's RNN support on (off by default:
    MCAN's question encoder and the LSTM decoders of Att2in and the MT LSTM are ``nn.LSTM``), so that those
    models compile into one graph instead of breaking around each LSTM."""
    torch._dynamo.config.allow_rnn = True
    return torch.compile(model, mode=mode, fullgraph=fullgraph)


def check_precision(precision: str, device: torch.device) -> str:
    """``precision`` if it is one of ``fp32|bf16|fp16`` and ``device`` supports it."""
    if precision not in PRECISIONS:
        raise DeviceError(f"train.precision={precision!r}: expected one of {', '.join(PRECISIONS)}")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise DeviceError(f"train.precision=bf16: {torch.cuda.get_device_name(device)} has no bfloat16; "
                          "use train.precision=fp16")
    return precision


@dataclasses.dataclass
class Runtime:
    """The device, precision and compilation of one process (see the module docstring)."""

    device: torch.device
    precision: str = "fp32"
    compile_mode: Optional[str] = None  # a torch.compile mode, or None: see compile_mode()
    env: DistEnv = dataclasses.field(default_factory=DistEnv)

    def __post_init__(self) -> None:
        check_precision(self.precision, self.device)
        self.compile_mode = compile_mode(self.compile_mode, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

    @classmethod
    def create(cls, device: Optional[str] = "auto", precision: str = "fp32", compile: Any = False,
               threads: Optional[int] = None, distributed: bool = False) -> "Runtime":
        """Resolve ``device`` and set up this process (torch threads; the torchrun process group
        when ``distributed``)."""
        if threads:
            torch.set_num_threads(threads)
        local_rank = int(os.environ.get("LOCAL_RANK", "0")) if distributed else 0
        resolved = resolve_device(device, local_rank)
        env = init_distributed(device=str(resolved)) if distributed else DistEnv(device=resolved)
        return cls(env.device, precision, compile, env)

    @classmethod
    def from_config(cls, cfg: Any, distributed: bool = False) -> "Runtime":
        """:meth:`create` from a run config: ``device``, ``train.precision``, ``train.compile`` (off where the config
        has no such key) and ``train.num_threads``."""
        train = cfg.train
        return cls.create(cfg.device, train.precision, train.get("compile", False), threads=train.num_threads,
                          distributed=distributed)

    # ------------------------------------------------------------------ model ----
    @property
    def compiled(self) -> bool:
        return self.compile_mode is not None

    @property
    def fixed_shapes(self) -> bool:
        """Whether batches should keep one shape (CUDA graphs record one graph per shape)."""
        return self.compile_mode == "reduce-overhead"

    def begin_step(self) -> None:
        """Mark a new training or evaluation step: with CUDA graphs (``reduce-overhead``) the outputs of the
        previous replay may then be overwritten (``torch.compiler.cudagraph_mark_step_begin``)."""
        if self.compile_mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()

    def compile(self, model: nn.Module) -> nn.Module:
        """:func:`compile_model` in this run's mode when compilation is on, else ``model`` itself."""
        return compile_model(model, self.compile_mode) if self.compiled else model

    @property
    def dtype(self) -> Optional[torch.dtype]:
        """The autocast dtype, or None for fp32."""
        return PRECISIONS[self.precision]

    def autocast(self) -> contextlib.AbstractContextManager:
        """Mixed precision for the forward pass (and the loss), or nothing for fp32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` (scaled with fp16); gradients accumulate until :meth:`step`."""
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, clip: Optional[Callable[[], Any]] = None) -> None:
        """``clip()`` on the true (unscaled) gradients, then the update; with fp16 an update with
        inf/NaN gradients is skipped and the loss scale adapts."""
        if clip is not None:
            self.scaler.unscale_(optimizer)
            clip()
        self.scaler.step(optimizer)
        self.scaler.update()

    def backward_step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer,
                      clip: Optional[Callable[[], Any]] = None) -> None:
        """:meth:`backward` then :meth:`step`: one loss, one update."""
        self.backward(loss)
        self.step(optimizer, clip)

    # ------------------------------------------------------------------ data -----
    @property
    def pin_memory(self) -> bool:
        """Whether host batches should be pinned (``DataLoader(pin_memory=...)``)."""
        return self.device.type == "cuda"

    def to_device(self, obj: Any) -> Any:
        """``obj`` with every tensor moved to the device (non-blocking from pinned memory);
        dicts, lists, tuples and dataclasses are walked, anything else is returned as it is."""
        if torch.is_tensor(obj):
            return obj.to(self.device, non_blocking=True)
        if isinstance(obj, Mapping):
            return {key: self.to_device(value) for key, value in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.to_device(value) for value in obj)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return dataclasses.replace(obj, **{f.name: self.to_device(getattr(obj, f.name))
                                               for f in dataclasses.fields(obj) if f.init})
        return obj

    # ------------------------------------------------------------------ records --
    def describe(self) -> dict:
        """What a results record says about where the run computed."""
        info = {"device": str(self.device), "precision": self.precision, "compile": self.compile_mode or False,
                "world_size": self.env.world_size}
        if self.device.type == "cuda":
            info["gpu"] = torch.cuda.get_device_name(self.device)
        return info

    def synchronize(self) -> None:
        """Wait for the device (for honest timings)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class LSTM(nn.LSTM):
    """``nn.LSTM`` (same parameters and checkpoints) that runs in float32 under CPU autocast:
    oneDNN's bfloat16 LSTM needs AVX-512 and fails on other CPUs ("could not create a primitive
    descriptor for the LSTM forward propagation primitive"). On CUDA autocast applies as usual."""

    def forward(self, input, hx=None):
        if torch.is_autocast_enabled("cpu") and self.weight_ih_l0.device.type == "cpu":
            with torch.autocast("cpu", enabled=False):
                return super().forward(input.float(), hx)
        return super().forward(input, hx)

