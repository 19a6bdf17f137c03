"""Fused Triton kernels for the normalizers (optional: ``pip install attention-suite[kernels]``).

The PyTorch implementations stay the reference and the fallback. :func:`use_triton` decides
for the tensor at hand, from ``ATTN_TRITON``:

* unset or ``auto``: the kernels handle CUDA tensors whenever Triton imports; CPU tensors take
  the PyTorch path;
* ``0``: never (the PyTorch path everywhere);
* ``1``: CUDA tensors, and CPU tensors too when Triton runs in its interpreter
  (``TRITON_INTERPRET=1``). The tests use this to run the dispatch without a GPU; the
  interpreter is far too slow for real work.

Code that ``torch.compile`` traces takes the PyTorch path (inductor fuses it): :func:`use_triton` says
no while compiling. A kernel behind a custom operator (``torch.ops.attention_suite.*``) decides when the
operator runs, so the compiled graph calls the kernel.

``TRITON_INTERPRET`` is read when a kernel module is imported: set it before importing
``common.attention.kernels.<module>`` (the test suite's ``conftest.py`` does).

A kernel that cannot compile or load on the GPU at hand (an older GPU, another Triton version)
must not end a user's run: kernels are launched through :func:`launch`, the backward kernels are
compiled and loaded by :func:`precompile` while the forward runs, and either raises
:class:`KernelFailure`; the normalizer then calls :func:`fall_back`, which warns once with the
kernel's name and the reason, and turns its family (``dense_bam``, ``edge_bam``, ``entmax``) off
for the rest of the process: :func:`use_triton` says no and the PyTorch path runs.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import warnings
from typing import Hashable, Iterator

import torch
from torch import Tensor

#: Kernel families that failed here, with the reason; they take the PyTorch path from then on.
FAILED: dict = {}
_PRECOMPILED: set = set()


#: Whether ``triton`` is installed here: found without importing it (an import costs a second at start-up),
#: and kept in a plain value, which torch.compile reads without tracing anything.
TRITON = importlib.util.find_spec("triton") is not None


def triton_available() -> bool:
    """Whether ``triton`` is installed here."""
    return TRITON


#: The compute capability kernels are compiled for, while :mod:`~common.attention.kernels.aot` records launches.
_TARGET_ARCH: list = []


@contextlib.contextmanager
def tf32_products(allowed: bool) -> Iterator[None]:
    """``torch.backends.cuda.matmul.allow_tf32`` set to ``allowed`` inside the block, as it was afterwards: the
    dense BAM kernels read it to choose their float32 products (:func:`.dense_bam.precision`)."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def target_arch() -> int:
    """The compute capability (``major * 10 + minor``) the next launch compiles for: the current CUDA device's,
    or the target being recorded by :mod:`~common.attention.kernels.aot` (90 without either)."""
    if _TARGET_ARCH:
        return _TARGET_ARCH[-1]
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return 10 * major + minor
    return 90


def interpreting() -> bool:
    """Whether Triton kernels run in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(x: Tensor, family: str = "", behind_op: bool = False) -> bool:
    """Whether the fused kernels (of ``family``, unless it failed here) should handle ``x`` (see the
    module docstring for ``ATTN_TRITON``); while ``torch.compile`` traces, only kernels ``behind_op``
    (a custom operator) do."""
    mode = os.environ.get("ATTN_TRITON", "auto")
    if mode == "0" or family in FAILED or (torch.compiler.is_compiling() and not behind_op) \
            or not triton_available():
        return False
    return x.is_cuda or (mode == "1" and x.device.type == "cpu" and interpreting())


class KernelFailure(RuntimeError):
    """A Triton kernel of ``family`` failed to compile, load or launch."""

    def __init__(self, family: str, kernel, error: BaseException):
        self.family, self.kernel = family, getattr(getattr(kernel, "fn", kernel), "__name__", repr(kernel))
        self.reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        super().__init__(f"Triton kernel {self.kernel} ({family}) failed: {self.reason}")


#: Keys of :func:`compiling_only` blocks: while one is open, launches compile and load their kernel instead.
_COMPILE_ONLY: list = []
_WARMED: set = set()


def launch(family: str, kernel, grid, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``; a failure to compile, load or launch raises :class:`KernelFailure`.
    Inside :func:`compiling_only`, the kernel is compiled and loaded (:func:`precompile`) but not run."""
    if _COMPILE_ONLY:
        precompile(family, _COMPILE_ONLY[-1], kernel, grid, *args, **kwargs)
        return
    try:
        kernel[grid](*args, **kwargs)
    except Exception as err:
        raise KernelFailure(family, kernel, err) from err


def precompile(family: str, key: Hashable, kernel, grid, *args, **kwargs) -> None:
    """Compile and load ``kernel`` for these arguments without running it, once per ``key`` (the
    caller's summary of what Triton specialises on): the forward pass calls it for its backward
    kernels, so that a backward kernel that cannot run here fails while the normalizer can still
    take the PyTorch path. A no-op under the interpreter."""
    if interpreting() or (kernel, key) in _PRECOMPILED:
        return
    try:
        kernel.warmup(*args, grid=grid, **kwargs)._init_handles()
    except Exception as err:
        raise KernelFailure(family, kernel, err) from err
    _PRECOMPILED.add((kernel, key))


@contextlib.contextmanager
def compiling_only(key: Hashable) -> Iterator[bool]:
    """``with compiling_only(key) as first:``: the first time ``key`` is seen (and not under the interpreter),
    ``first`` is True and the launches of the block compile and load their kernels without running them, so
    that a forward pass can check its backward kernels while it can still fall back; afterwards False."""
    first = not interpreting() and key not in _WARMED
    if first:
        _COMPILE_ONLY.append(key)
    try:
        yield first
    finally:
        if first:
            _COMPILE_ONLY.pop()
            _WARMED.add(key)


def int_key(*values: int) -> tuple:
    """What Triton specialises integer arguments on (equal to 1, divisible by 16), for :func:`precompile` keys."""
    return tuple((v == 1, v % 16 == 0) for v in values)


def fall_back(failure: KernelFailure) -> None:
    """Turn ``failure.family`` off for this process (:func:`use_triton` says no from now on), with one warning."""
    if failure.family not in FAILED:
        FAILED[failure.family] = failure.reason
        warnings.warn(f"{failure}; the {failure.family} kernels are off for the rest of this process and the "
                      "PyTorch path runs instead (set ATTN_TRITON=0 to skip them from the start)", RuntimeWarning,
                      stacklevel=3)
