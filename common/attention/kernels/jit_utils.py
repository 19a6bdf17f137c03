"""Triton helpers shared by the kernels."""
import triton
import triton.language as tl


@triton.jit
def upcast(x):
    """Half-precision values as float32 (Triton's log, exp, exp2 and sqrt take float32 or float64); others
    as they are."""
    if x.dtype.primitive_bitwidth < 32:
        return x.to(tl.float32)
    else:
        return x


@triton.jit
def lgamma(x):
    """``log Gamma(x)`` for ``x > 0``: six recurrence steps up, then Stirling's series."""
    shift = tl.zeros_like(x)
    for _ in tl.static_range(6):
        small = x < 6.0
        shift = tl.where(small, shift - tl.log(x), shift)
        x = tl.where(small, x + 1.0, x)
    inv = 1.0 / x
    inv2 = inv * inv
    series = inv * (1.0 / 12 - inv2 * (1.0 / 360 - inv2 * (1.0 / 1260 - inv2 / 1680)))
    return shift + (x - 0.5) * tl.log(x) - x + 0.9189385332046727 + series


@triton.jit
def digamma(x):
    """``psi(x)`` for ``x > 0``: six recurrence steps up, then the asymptotic series."""
    shift = tl.zeros_like(x)
    for _ in tl.static_range(6):
        small = x < 6.0
        shift = tl.where(small, shift - 1.0 / x, shift)
        x = tl.where(small, x + 1.0, x)
    inv = 1.0 / x
    inv2 = inv * inv
    series = inv2 * (1.0 / 12 - inv2 * (1.0 / 120 - inv2 * (1.0 / 252 - inv2 * (1.0 / 240 - inv2 / 132))))
    return shift + tl.log(x) - 0.5 * inv - series
