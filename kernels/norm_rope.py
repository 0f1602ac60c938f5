"""RMS norm and RoPE as one CPU primitive each.

On the CPU, ``mx.fast.rms_norm`` and ``mx.fast.rope`` run as their composed fallbacks: a
dozen graph nodes each, and a decoded token of the bundled model runs 61 norms and 60
ropes, so graph overhead, not arithmetic, dominates them. The kernels (``csrc/norm_rope.cpp``)
are one node each, computed in float32.

- :func:`rms_norm`, :func:`rope`: the kernel where it runs and the input fits (float32, an
  integer offset); ``mx.fast`` otherwise, which is also the reference the tests compare with.

Not promised: bit-identical results to ``mx.fast`` (RoPE's angles are computed in another
order; they agree to float32 rounding).
"""

from __future__ import annotations

import mlx.core as mx

from .ext import extension


def rms_norm(x: mx.array, weight: mx.array, eps: float, use_kernel: bool = True) -> mx.array:
    ext = extension() if use_kernel else None
    if ext is None or x.dtype != mx.float32 or weight.dtype != mx.float32:
        return mx.fast.rms_norm(x, weight, eps)
    return ext.rms_norm(x, weight, eps)


def rope(x: mx.array, dims: int, *, traditional: bool, base: float, scale: float, offset,
         use_kernel: bool = True) -> mx.array:
    ext = extension() if use_kernel else None
    if ext is None or x.dtype != mx.float32 or not isinstance(offset, int) or x.ndim < 2:
        return mx.fast.rope(x, dims, traditional=traditional, base=base, scale=scale,
                            offset=offset)
    return ext.rope(x, dims, traditional, base, scale, offset)
