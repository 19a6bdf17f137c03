"""Fused CPU row kernels of dense BAM (``cpu/bam_rows.c``), compiled on first use.

Dense BAM's chunks (:mod:`common.attention.dense_bam`) spend most of their non-matrix time in
elementwise passes: drawing the noise (two ``log`` per Weibull entry, or Box-Muller), adding
it, the softmax, the KL's log-sum-exp, and in the backward pass the softmax and log-sum-exp
gradients. :func:`sample` and :func:`grad` do each row's share in one visit, with the noise
from Philox4x32-10 keyed by (seed, group, query, key), vectorized by the compiler (glibc's
vector ``logf``/``expf``/``sinf``/``cosf`` where available).

The C source is compiled with the system's C compiler (``$CC`` or ``cc``) the first time it
is needed, into ``$ATTN_KERNEL_CACHE`` (default ``$XDG_CACHE_HOME/attention-suite`` or
``~/.cache/attention-suite``), keyed by the source, the flags, the compiler and the CPU. Without a compiler, or with
``ATTN_CPU_KERNELS=0``, :func:`available` is False and the chunks keep their PyTorch passes
(a warning says why, once). Calls release the GIL, so a chunk's rows are split over
``torch.get_num_threads()`` threads.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

NOISE_NONE, NOISE_WEIBULL, NOISE_NORMAL = 0, 1, 2
_SOURCE = Path(__file__).with_name("cpu") / "bam_rows.c"
_FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math"]


def _native_flags() -> list:
    """``-march=native`` where the compiler knows it (x86-64, arm64), for the vector units."""
    return ["-march=native"] if platform.machine() in ("x86_64", "AMD64") else ["-mcpu=native"]


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def _compile(target: Path, compiler: str, flags: list) -> None:
    mvec = ["-DATTN_LIBMVEC", "-lmvec"] if sys.platform.startswith("linux") and platform.machine() == "x86_64" else []
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        for extra in (mvec, []) if mvec else ([],):  # without libmvec the loops call the scalar functions
            result = subprocess.run([compiler, *flags, str(_SOURCE), "-o", str(built), *extra, "-lm"],
                                    capture_output=True, text=True)
            if result.returncode == 0:
                break
        else:
            raise RuntimeError(f"{compiler} failed on {_SOURCE}:\n{result.stderr[-2000:]}")
        os.replace(built, target)  # atomic: a concurrent process sees the old file or the whole new one


@functools.lru_cache(maxsize=None)
def _library() -> Optional[ctypes.CDLL]:
    compiler = os.environ.get("CC", "cc")
    flags = _FLAGS + _native_flags()
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
        key = hashlib.sha256("\0".join([_SOURCE.read_text(), *flags, version, _cpu_signature()]).encode())
        cache = Path(os.environ.get("ATTN_KERNEL_CACHE")
                     or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attention-suite")
        target = cache / f"bam_rows-{key.hexdigest()[:16]}.so"
        if not target.exists():
            _compile(target, compiler, flags)
        lib = ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as error:
        warnings.warn(f"dense BAM: the fused CPU kernels could not be built ({error}); the chunks use "
                      "PyTorch's operators instead (slower). Install a C compiler (gcc or clang) or set "
                      "ATTN_CPU_KERNELS=0 to silence this.", RuntimeWarning, stacklevel=3)
        return None
    i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    lib.bam_sample.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, i64, ctypes.c_uint64, ctypes.c_int,
                               f32, ctypes.c_uint32, f32, ctypes.c_int]
    lib.bam_sample.restype = None
    lib.bam_grad.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, i64]
    lib.bam_grad.restype = None
    return lib


def available() -> bool:
    """Whether the kernels are on (``ATTN_CPU_KERNELS`` is not ``0``, read at each call) and build here."""
    return os.environ.get("ATTN_CPU_KERNELS", "1") != "0" and _library() is not None


@functools.lru_cache(maxsize=4)
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix="bam-rows")


def _over_rows(call, rows: int) -> None:
    """``call(begin, end)`` over the rows, split over ``torch.get_num_threads()`` threads."""
    threads = min(torch.get_num_threads(), max(1, rows // 8))
    if threads == 1:
        call(0, rows)
        return
    bounds = [rows * t // threads for t in range(threads + 1)]
    list(_pool(threads).map(call, bounds[:-1], bounds[1:]))


def _ptr(x: Optional[Tensor]) -> Optional[int]:
    if x is None:
        return None
    if x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous():
        raise ValueError(f"the CPU BAM kernels take contiguous float32 CPU tensors, got {x.dtype} "
                         f"{x.device} {'contiguous' if x.is_contiguous() else 'strided'}")
    return x.data_ptr()


def sample(s: Tensor, out: Tensor, seed: int, group: int, query: int, kind: int, noise_scale: float,
           keep: Optional[Tensor] = None, dropout: float = 0.0, lse: Optional[Tensor] = None,
           sq: Optional[Tensor] = None, softmax: bool = True) -> None:
    """Chunk scores ``s [G, R, K]`` (``-inf`` where hidden) of groups ``group + g``, queries
    ``query + r``: ``out = softmax(s + noise_scale n)`` (``s + noise_scale n`` when not
    ``softmax``), the dropout scale ``[u >= dropout] / (1 - dropout)`` in ``keep``, and the
    clean scores' ``log sum_j exp(s_ij)`` in ``lse [G, R]`` and their ``sum_j s_ij^2`` (finite
    ``s_ij`` only) in ``sq [G, R]`` (each optional).

    ``n`` is the standard log-noise of ``kind`` (``NOISE_WEIBULL``: ``log(-log u)``,
    ``NOISE_NORMAL``: ``N(0, 1)``), drawn from Philox4x32-10 with key ``seed`` and counter
    ``(key // 4, query, group, 0)`` (dropout: ``1``), ``u = (m + 1/2) 2^-23`` from a word's top
    23 bits. Rows without a finite score get zero weights and ``LSE = -inf``."""
    lib = _library()
    G, R, K = s.shape
    if out.shape != s.shape or (keep is not None and keep.shape != s.shape):
        raise ValueError(f"sample: out {tuple(out.shape)} and keep must have the scores' shape {tuple(s.shape)}")
    threshold = round(dropout * (1 << 24)) if keep is not None else 0
    drop_scale = 1.0 / (1.0 - dropout) if keep is not None else 0.0
    args = (_ptr(s), _ptr(out), _ptr(keep), _ptr(lse), _ptr(sq), R, K, group, query)
    tail = (seed % (1 << 64), kind, noise_scale, threshold, drop_scale, int(softmax))
    _over_rows(lambda begin, end: lib.bam_sample(*args, begin, end, *tail), G * R)


def grad(d_w: Tensor, w: Tensor, keep: Optional[Tensor], d_norm: Tensor, s: Optional[Tensor] = None,
         lse: Optional[Tensor] = None, d_lse: Optional[Tensor] = None, d_sq: Optional[Tensor] = None) -> None:
    """In place of ``d_w [G, R, K]``: the scores' gradient ``(d_w keep - d_norm) w + d_lse p +
    2 d_sq s`` with ``p = exp(s - LSE)`` (when ``lse``/``d_lse`` are given) and ``s`` counted
    only where finite (when ``d_sq`` is given); ``d_norm``, ``lse``, ``d_lse``, ``d_sq`` are
    ``[G, R]``."""
    lib = _library()
    G, R, K = d_w.shape
    if (lse is not None or d_sq is not None) and s is None:
        raise ValueError("grad: the LSE and square-sum terms need the scores s")
    args = [_ptr(x) for x in (d_w, w, keep, s, d_norm, lse, d_lse, d_sq)]
    _over_rows(lambda begin, end: lib.bam_grad(*args, K, begin, end), G * R)
