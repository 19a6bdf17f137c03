"""Fused CPU row kernels of dense BAM (``cpu/bam_rows.c``), compiled on first use.

Dense BAM's chunks (:mod:`common.attention.dense_bam`) spend most of their non-matrix time in
elementwise passes: drawing the noise (two ``log`` per Weibull entry, or Box-Muller), adding
it, the softmax, the KL's log-sum-exp, and in the backward pass the softmax and log-sum-exp
gradients. :func:`sample`, :func:`grad` and :func:`regrad` do each row's share in one visit,
with the noise from Philox4x32-10 keyed by (seed, group, query, key), vectorized by the
compiler (glibc's vector ``logf``/``expf``/``sinf``/``cosf`` where available).

The C source is compiled with the system's C compiler (``$CC`` or ``cc``) the first time it
is needed, into ``$ATTN_KERNEL_CACHE`` (default ``$XDG_CACHE_HOME/attention-suite`` or
``~/.cache/attention-suite``), keyed by the source, the flags, the compiler and the CPU. Without a compiler, or with
``ATTN_CPU_KERNELS=0``, :func:`available` is False and the chunks keep their PyTorch passes
(a warning says why, once). A call splits its rows over ``torch.get_num_threads()`` OpenMP
threads; built with GCC, the kernels share libgomp, and its thread pool, with PyTorch's own
operators (a separate pool of Python threads ran at half the speed: PyTorch's OpenMP workers
spin on the cores for a while after each operator). Where the compiler has no OpenMP the
kernels run on one thread.
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
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

NOISE_NONE, NOISE_WEIBULL, NOISE_NORMAL = 0, 1, 2
_SOURCES = Path(__file__).with_name("cpu")  # the C sources and their headers
_FLAGS = ["-O3", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math"]


def _native_flags() -> list:
    """``-march=native`` where the compiler knows it (x86-64, arm64), for the vector units."""
    return ["-march=native"] if platform.machine() in ("x86_64", "AMD64") else ["-mcpu=native"]


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def _compile(source: Path, target: Path, compiler: str, flags: list) -> None:
    """Builds the kernels with OpenMP and glibc's vector math where the compiler has them, else
    without: OpenMP's loops then run on one thread, and the vector loops call the scalar functions."""
    mvec = ["-DATTN_LIBMVEC", "-lmvec"] if sys.platform.startswith("linux") and platform.machine() == "x86_64" else []
    options = [threads + math for threads in (["-fopenmp"], ["-fopenmp-simd"])
               for math in ((mvec, []) if mvec else ([],))]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        for extra in options:
            result = subprocess.run([compiler, *flags, str(source), "-o", str(built), *extra, "-lm"],
                                    capture_output=True, text=True)
            if result.returncode == 0:
                break
        else:
            raise RuntimeError(f"{compiler} failed on {source}:\n{result.stderr[-2000:]}")
        os.replace(built, target)  # atomic: a concurrent process sees the old file or the whole new one


def build(name: str, what: str) -> Optional[ctypes.CDLL]:
    """``cpu/<name>.c`` compiled (once per source, headers, flags, compiler and CPU, into the cache) and
    loaded, or None with a warning that ``what`` uses PyTorch's operators instead."""
    compiler = os.environ.get("CC", "cc")
    flags = _FLAGS + _native_flags()
    source = _SOURCES / f"{name}.c"
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
        texts = [path.read_text() for path in (source, *sorted(_SOURCES.glob("*.h")))]
        key = hashlib.sha256("\0".join([*texts, *flags, version, _cpu_signature()]).encode())
        cache = Path(os.environ.get("ATTN_KERNEL_CACHE")
                     or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attention-suite")
        target = cache / f"{name}-{key.hexdigest()[:16]}.so"
        if not target.exists():
            _compile(source, target, compiler, flags)
        return ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as error:
        warnings.warn(f"{what}: the fused CPU kernels could not be built ({error}); PyTorch's operators run "
                      "instead (slower). Install a C compiler (gcc or clang) or set ATTN_CPU_KERNELS=0 to silence "
                      "this.", RuntimeWarning, stacklevel=4)
        return None


def threads_for(entries: int) -> int:
    """Threads for a call over ``entries`` entries: ``torch.get_num_threads()``, but one per 32768 entries at most
    (PyTorch's own grain), so that small calls do not wait for threads with nothing to do."""
    return max(1, min(torch.get_num_threads(), entries // 32768))


@functools.lru_cache(maxsize=None)
def _library() -> Optional[ctypes.CDLL]:
    lib = build("bam_rows", "dense BAM")
    if lib is None:
        return None
    i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    u64, u32, i32 = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int
    lib.bam_sample.argtypes = [ptr] * 6 + [i64] * 5 + [i32, u64, i32, f32, u32, f32, i32]
    lib.bam_grad.argtypes = [ptr] * 8 + [i64, i64, i32]
    lib.bam_regrad.argtypes = [ptr] * 8 + [i64] * 6 + [i32, u64, i32, f32, u32, f32, i32]
    for function in (lib.bam_sample, lib.bam_grad, lib.bam_regrad):
        function.restype = None
    return lib


def available() -> bool:
    """Whether the kernels are on (``ATTN_CPU_KERNELS`` is not ``0``, read at each call) and build here."""
    return os.environ.get("ATTN_CPU_KERNELS", "1") != "0" and _library() is not None


def _ptr(x: Optional[Tensor]) -> Optional[int]:
    if x is None:
        return None
    if x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous():
        raise ValueError(f"the CPU BAM kernels take contiguous float32 CPU tensors, got {x.dtype} "
                         f"{x.device} {'contiguous' if x.is_contiguous() else 'strided'}")
    return x.data_ptr()


def _dropout_args(dropout: float, on: bool) -> tuple:
    """The kernels' dropout threshold on a word's low 24 bits, and the scale ``1 / (1 - p)``."""
    return (round(dropout * (1 << 24)), 1.0 / (1.0 - dropout)) if on else (0, 0.0)


def sample(s: Tensor, out: Tensor, seed: int, group: int, query: int, kind: int, noise_scale: float,
           keep: Optional[Tensor] = None, dropout: float = 0.0, lse: Optional[Tensor] = None,
           sq: Optional[Tensor] = None, softmax: bool = True, lse_z: Optional[Tensor] = None) -> None:
    """Chunk scores ``s [G, R, K]`` (``-inf`` where hidden) of groups ``group + g``, queries
    ``query + r``: ``out = softmax(s + noise_scale n)`` (``s + noise_scale n`` when not
    ``softmax``), the dropout scale ``[u >= dropout] / (1 - dropout)`` in ``keep``, the clean
    scores' ``log sum_j exp(s_ij)`` in ``lse [G, R]`` and their ``sum_j s_ij^2`` (finite
    ``s_ij`` only) in ``sq [G, R]``, and the noisy scores' ``log sum_j exp(z_ij)`` (the
    softmax's normaliser, for :func:`regrad`) in ``lse_z [G, R]`` (each optional).

    ``n`` is the standard log-noise of ``kind`` (``NOISE_WEIBULL``: ``log(-log u)``,
    ``NOISE_NORMAL``: ``N(0, 1)``), drawn from Philox4x32-10 with key ``seed`` and counter
    ``(key // 4, query, group, 0)`` (dropout: ``1``), ``u = (m + 1/2) 2^-23`` from a word's top
    23 bits. Rows without a finite score get zero weights and ``LSE = -inf``."""
    lib = _library()
    G, R, K = s.shape
    if out.shape != s.shape or (keep is not None and keep.shape != s.shape):
        raise ValueError(f"sample: out {tuple(out.shape)} and keep must have the scores' shape {tuple(s.shape)}")
    if lse_z is not None and not softmax:
        raise ValueError("sample: lse_z is the softmax's normaliser; it needs softmax=True")
    lib.bam_sample(*(_ptr(x) for x in (s, out, keep, lse, sq, lse_z)), R, K, group, query, G * R,
                   torch.get_num_threads(), seed % (1 << 64), kind, noise_scale,
                   *_dropout_args(dropout, keep is not None), int(softmax))


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
    lib.bam_grad(*(_ptr(x) for x in (d_w, w, keep, s, d_norm, lse, d_lse, d_sq)), K, G * R, torch.get_num_threads())


def regrad(d_w: Tensor, dropped: Tensor, s: Tensor, lse_z: Tensor, d_norm: Tensor, seed: int, group: int, query: int,
           kind: int, noise_scale: float, dropout: float = 0.0, lse: Optional[Tensor] = None,
           d_lse: Optional[Tensor] = None, d_sq: Optional[Tensor] = None, key: int = 0) -> None:
    """The backward pass of a chunk whose weights were not kept, in one visit of each row: its
    forward weights again, ``w = exp(s + noise_scale n - lse_z)`` with :func:`sample`'s noise and
    normaliser ``lse_z``, their dropped form ``w keep`` (``keep`` redrawn when ``dropout``) into
    ``dropped``, and :func:`grad`'s scores gradient in place of ``d_w``. Shapes as :func:`grad`'s;
    the chunk may be a block of the rows' keys, from ``key`` (a multiple of 4) on."""
    lib = _library()
    G, R, K = d_w.shape
    if s.shape != d_w.shape or dropped.shape != d_w.shape:
        raise ValueError(f"regrad: s {tuple(s.shape)} and dropped {tuple(dropped.shape)} must have d_w's shape "
                         f"{tuple(d_w.shape)}")
    if key % 4:
        raise ValueError(f"regrad: a block of keys starts at a multiple of 4 (one Philox call's words), got {key}")
    lib.bam_regrad(*(_ptr(x) for x in (d_w, dropped, s, lse_z, d_norm, lse, d_lse, d_sq)), R, K, group, query, key,
                   G * R, torch.get_num_threads(), seed % (1 << 64), kind, noise_scale,
                   *_dropout_args(dropout, bool(dropout)), int(bool(dropout)))
