"""Fused Triton kernels for the normalizers (optional: ``pip install attention-suite[kernels]``).

The PyTorch implementations stay the reference and the fallback. :func:`use_triton` decides
for the tensor at hand, from ``ATTN_TRITON``:

* unset or ``auto``: the kernels handle CUDA tensors whenever Triton imports; CPU tensors take
  the PyTorch path;
* ``0``: never (the PyTorch path everywhere);
* ``1``: CUDA tensors, and CPU tensors too when Triton runs in its interpreter
  (``TRITON_INTERPRET=1``). The tests use this to run the dispatch without a GPU; the
  interpreter is far too slow for real work.

``TRITON_INTERPRET`` is read when a kernel module is imported: set it before importing
``common.attention.kernels.<module>`` (the test suite's ``conftest.py`` does).
"""
from __future__ import annotations

import functools
import os

from torch import Tensor


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    """Whether ``triton`` imports here."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """Whether Triton kernels run in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(x: Tensor) -> bool:
    """Whether the fused kernels should handle ``x`` (see the module docstring for ``ATTN_TRITON``)."""
    mode = os.environ.get("ATTN_TRITON", "auto")
    if mode == "0" or not triton_available():
        return False
    return x.is_cuda or (mode == "1" and x.device.type == "cpu" and interpreting())
