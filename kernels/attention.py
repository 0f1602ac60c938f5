"""Attention for one query position (decode) as one CPU primitive.

On the CPU, ``mx.fast.scaled_dot_product_attention`` runs as its composed fallback: about
ten graph nodes per layer and token with grouped-query heads. The kernel
(``csrc/attention.cpp``) is one node: scores, a max-subtracted softmax and the weighted sum
of values per head, heads spread over the kernels' thread pool, the keys and values read in
place from a cache buffer's slice.

- :func:`attention`: the kernel for a single float32 query position without a mask and at
  most :data:`DECODE_MAX_KEYS` keys; ``mx.fast.scaled_dot_product_attention`` otherwise,
  which is also the reference the tests compare with.

Not promised: bit-identical results to ``mx.fast`` (another exp and summation order; they
agree to float32 rounding), or a speed-up for long contexts, which keep MLX's matmuls.
"""

from __future__ import annotations

import mlx.core as mx

from .ext import extension

DECODE_MAX_KEYS = 4096  # past this, MLX's BLAS matmuls are left to do the work


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask=None,
              use_kernel: bool = True) -> mx.array:
    """``softmax(scale * q @ k^T + mask) @ v`` for ``[B, heads, L, D]`` arrays."""
    ext = extension() if use_kernel else None
    if (ext is None or mask is not None or q.shape[2] != 1 or k.shape[2] > DECODE_MAX_KEYS
            or any(a.dtype != mx.float32 for a in (q, k, v))):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    return ext.decode_attention(q, k, v, scale)
