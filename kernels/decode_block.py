"""A llama decoder layer's decode step as two CPU primitives around the attention.

A decoded token runs each layer's norm, projections, RoPE, casts, residuals and MLP as about
twenty graph nodes, and on the CPU each node costs microseconds of scheduling, allocation
and Python: across 30 layers, about as much as the matmuls. Here they are two nodes
(``csrc/decode_block.cpp``), and the cache update and attention between them stay as they
are:

- :func:`attention_inputs`: ``rms_norm(x)`` -> q, k and v projections (with any LoRA
  adapter on them) -> RoPE on q and k -> k and v in the cache's dtype;
- :func:`layer_tail`: ``h = x + o(attn)``; ``h + down(silu(gate(n)) * up(n))`` with
  ``n = rms_norm(h)``.

Each takes a decode step's activations (``[B, 1, E]`` float32, B at most
:data:`~mlx_agent.kernels.qmatmul.KERNEL_MAX_ROWS`) and quantized weights the matmul kernel
reads; anything else, or no kernel, runs the ``*_ops`` reference in MLX ops. Not promised:
bit-identical results to the reference (the kernels sum in another order and take the
exponential sixteen lanes at a time; they agree to float32 rounding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import mlx.core as mx
import mlx.nn as nn

from .ext import extension
from .qmatmul import KERNEL_MAX_ROWS, QWeights, quantized_matmul_ops


@dataclass(frozen=True)
class Rope:
    """``mx.fast.rope``'s settings: the position, or each batch row's (``[B]`` integers, as
    mlx-lm's ``BatchKVCache`` keeps them)."""

    dims: int
    traditional: bool
    base: float
    scale: float
    offset: int | mx.array


@dataclass(frozen=True)
class Lora:
    """A LoRA adapter on projection ``target`` (0: q, 1: k, 2: v): it adds
    ``scale * (n @ a) @ b``."""

    target: int
    a: mx.array  # [E, r]
    b: mx.array  # [r, N]
    scale: float


def attention_inputs_ops(x: mx.array, norm: mx.array, eps: float, qkv: Sequence[QWeights],
                         n_heads: int, n_kv_heads: int, rope: Rope, kv_dtype: mx.Dtype,
                         lora: Sequence[Lora] = ()) -> tuple[mx.array, mx.array, mx.array]:
    """Reference: q ``[B, H, L, D]`` float32 and k, v ``[B, KVH, L, D]`` in ``kv_dtype``
    for x ``[B, L, E]``, RoPE from ``rope.offset``; each :class:`Lora` adds to its
    projection as mlx-lm's ``LoRALinear`` does."""
    n = mx.fast.rms_norm(x, norm, eps)
    B, L, _ = x.shape
    proj = [quantized_matmul_ops(n, *w) for w in qkv]
    for a in lora:
        proj[a.target] = proj[a.target] + a.scale * ((n @ a.a) @ a.b)
    q, k, v = (p.reshape(B, L, heads, -1).transpose(0, 2, 1, 3)
               for p, heads in zip(proj, (n_heads, n_kv_heads, n_kv_heads)))
    q, k = (mx.fast.rope(a, rope.dims, traditional=rope.traditional, base=rope.base,
                         scale=rope.scale, offset=rope.offset) for a in (q, k))
    return q, k.astype(kv_dtype), v.astype(kv_dtype)


def layer_tail_ops(attn: mx.array, x: mx.array, norm: mx.array, eps: float, o: QWeights,
                   gate: QWeights, up: QWeights, down: QWeights) -> mx.array:
    """Reference: ``h = x + o(attn)``, then ``h + down(silu(gate(n)) * up(n))``."""
    h = x + quantized_matmul_ops(attn, *o)
    n = mx.fast.rms_norm(h, norm, eps)
    act = nn.silu(quantized_matmul_ops(n, *gate)) * quantized_matmul_ops(n, *up)
    return h + quantized_matmul_ops(act, *down)


def _fits(x: mx.array, norm: mx.array):
    ext = extension()
    ok = (x.ndim == 3 and x.shape[1] == 1 and x.shape[0] <= KERNEL_MAX_ROWS
          and x.dtype == mx.float32 and norm.dtype == mx.float32)
    return ext if ok else None


def _flat(weights: Sequence[QWeights]) -> tuple[list[mx.array], list[int]]:
    return [a for w in weights for a in w[:3]], [w[3] for w in weights]


def attention_inputs(x: mx.array, norm: mx.array, eps: float, qkv: Sequence[QWeights],
                     n_heads: int, n_kv_heads: int, rope: Rope, kv_dtype: mx.Dtype,
                     lora: Sequence[Lora] = (), use_kernel: bool = True,
                     packed: Sequence[mx.array] = ()) -> tuple[mx.array, mx.array, mx.array]:
    """As :func:`attention_inputs_ops`; one node on the kernel (``packed``: none, or q, k and
    v packed, as :func:`~mlx_agent.kernels.qmatmul.pack` makes them)."""
    ext = _fits(x, norm) if use_kernel else None
    if ext is None or kv_dtype not in (mx.float32, mx.float16):
        return attention_inputs_ops(x, norm, eps, qkv, n_heads, n_kv_heads, rope, kv_dtype,
                                    lora)
    arrays, bits = _flat(qkv)
    rows = rope.offset if isinstance(rope.offset, mx.array) else None
    q, k, v = ext.attention_inputs(x, norm, eps, arrays, bits, n_heads, n_kv_heads, rope.dims,
                                   rope.traditional, rope.base, rope.scale,
                                   0 if rows is not None else rope.offset, kv_dtype, rows,
                                   [m for a in lora for m in (a.a, a.b)],
                                   [a.target for a in lora], [float(a.scale) for a in lora],
                                   list(packed))
    return q, k, v


def layer_tail(attn: mx.array, x: mx.array, norm: mx.array, eps: float, o: QWeights,
               gate: QWeights, up: QWeights, down: QWeights, use_kernel: bool = True,
               packed: Sequence[mx.array] = ()) -> mx.array:
    """As :func:`layer_tail_ops`; one node on the kernel (``packed``: none, or the four
    matrices packed)."""
    ext = _fits(x, norm) if use_kernel else None
    if ext is None or attn.dtype != mx.float32:
        return layer_tail_ops(attn, x, norm, eps, o, gate, up, down)
    arrays, bits = _flat((o, gate, up, down))
    return ext.layer_tail(attn, x, norm, eps, arrays, bits, list(packed))
