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
