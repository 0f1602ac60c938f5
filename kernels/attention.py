"""Attention for one query position (decode) as one CPU primitive.

On the CPU, ``mx.fast.scaled_dot_product_attention`` runs as its composed fallback: about
ten graph nodes per layer and token with grouped-query heads. The kernel
(``csrc/attention.cpp``) is one node. Each key/value head's rows are read once, from memory
in place (a cache buffer's slice, float32 or float16), for all the query heads that share
it; its keys are split into ranges over the kernels' thread pool, each range leaving a
partial softmax (vectorised exp) that the ranges' results are merged from.

- :func:`attention`: the kernel for a single float32 query position without a mask, head
  sizes a multiple of 16 and at most :data:`DECODE_MAX_KEYS` keys;
  ``mx.fast.scaled_dot_product_attention`` otherwise, which is also the reference the tests
  compare with.

Not promised: bit-identical results to ``mx.fast`` (another exp and summation order; they
agree to float32 rounding).
"""

from __future__ import annotations

import mlx.core as mx

from .ext import extension

DECODE_MAX_KEYS = 4096  # past this, MLX's BLAS matmuls are left to do the work
_KV_DTYPES = (mx.float32, mx.float16)


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask=None,
              use_kernel: bool = True) -> mx.array:
    """``softmax(scale * q @ k^T + mask) @ v`` for ``[B, heads, L, D]`` arrays."""
    ext = extension() if use_kernel else None
    if (ext is None or mask is not None or q.shape[2] != 1 or k.shape[2] > DECODE_MAX_KEYS
            or q.dtype != mx.float32 or k.dtype != v.dtype or k.dtype not in _KV_DTYPES
            or q.shape[-1] % 16 or v.shape[-1] % 16):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    return ext.decode_attention(q, k, v, scale)
