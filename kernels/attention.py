"""Attention for decode steps and prefill chunks as CPU primitives.

On the CPU, ``mx.fast.scaled_dot_product_attention`` runs as its composed fallback: about
ten graph nodes per layer and token with grouped-query heads. The kernel
(``csrc/attention.cpp``) is one node. Each key/value head's rows are read once, from memory
in place (a cache buffer's slice, float32 or float16), for all the query heads that share
it; its keys are split into ranges over the kernels' thread pool, each range leaving a
partial softmax (vectorised exp) that the ranges' results are merged from. A range is read
sixteen rows at a time (float16 rows widened once, with VCVTPH2PS where the CPU has it):
each query head's sixteen scores from eight-key accumulators, then the values with up to
four heads' sums of 64 features in registers (``scripts/bench_decode_attention.py``).

A prefill chunk's causal attention (``csrc/prefill_attention.cpp``) is one node too: MLX's
fallback runs its softmax with a scalar exp, which dominated long prompts. A task takes a few
query rows of a query group, scores sixteen keys at a time from a transposed tile of keys,
masks, exponentiates sixteen at a time and sums the values.

- :func:`attention`: the decode kernel for a single float32 query position without a mask,
  or with the padding mask of a left-padded batch given as each row's first key
  (``starts``: a batched decode step), the prefill kernel for a ``"causal"`` mask; head
  sizes a multiple of 16 and at most :data:`MAX_KEYS` keys.
  ``mx.fast.scaled_dot_product_attention`` otherwise, which is also the reference the tests
  compare with.

Not promised: bit-identical results to ``mx.fast`` (another exp and summation order; they
agree to float32 rounding).
"""

from __future__ import annotations

import mlx.core as mx

from .ext import extension

MAX_KEYS = 8192  # past this, mx.fast (MLX's BLAS matmuls) does the work
_KV_DTYPES = (mx.float32, mx.float16)


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask=None,
              use_kernel: bool = True, starts: mx.array | None = None) -> mx.array:
    """``softmax(scale * q @ k^T + mask) @ v`` for ``[B, heads, L, D]`` arrays.

    ``starts`` (``[B]`` integers, with a single query position) says the same as ``mask``
    in the kernel's terms: row b sees keys ``starts[b]`` onwards (a left-padded batch's
    padding mask); ``mask`` is what the fallback applies."""
    ext = extension() if use_kernel else None
    fits = (ext is not None and k.shape[2] <= MAX_KEYS and q.dtype == mx.float32
            and k.dtype == v.dtype and k.dtype in _KV_DTYPES
            and q.shape[-1] % 16 == 0 and v.shape[-1] % 16 == 0)
    if fits and q.shape[2] == 1 and (mask is None or starts is not None):
        return ext.decode_attention(q, k, v, scale, starts)
    if fits and isinstance(mask, str) and mask == "causal" and q.shape[2] <= k.shape[2]:
        return ext.prefill_attention(q, k, v, scale)
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
