"""Model layers that compute on the CPU kernels (:mod:`mlx_agent.kernels`).

:func:`use_cpu_kernels` swaps, in place, layers for subclasses that keep the very same arrays
and settings:

- ``nn.QuantizedLinear`` and ``nn.QuantizedEmbedding`` whose layout the kernel reads (affine,
  group size 32, 4 or 8 bits: GGUF Q4_0, Q4_1 and Q8_0 as loaded) compute with
  :func:`~mlx_agent.kernels.quantized_matmul` (the matmul kernel for decode and small
  batches, dequantize + BLAS for prefill chunks); a tied embedding's output head too;
- ``nn.RMSNorm`` and ``nn.RoPE`` run as one graph node each
  (:mod:`mlx_agent.kernels.norm_rope`) instead of MLX's composed CPU fallbacks;
- mlx-lm's llama ``Attention`` attends a decode step's one query with
  :func:`mlx_agent.kernels.attention` (one node); everything else about it is mlx-lm's.

Not promised: other quantization modes, group sizes or RoPE variants (those layers are left
as they are), or bit-identical logits to the float32 reference (they agree to float32
rounding; see tests/test_qmatmul.py).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.base import scaled_dot_product_attention

from ..kernels import attention, kernel_status, quantized_matmul, rms_norm, rope
from ..kernels.qmatmul import BITS, GROUP_SIZE


def _matmul(layer, x: mx.array) -> mx.array:
    return quantized_matmul(x, layer["weight"], layer["scales"], layer["biases"], layer.bits)


class KernelQuantizedLinear(nn.QuantizedLinear):
    """``nn.QuantizedLinear`` computed by the CPU kernel."""

    def __call__(self, x: mx.array) -> mx.array:
        y = _matmul(self, x)
        return y + self["bias"] if "bias" in self else y


class KernelQuantizedEmbedding(nn.QuantizedEmbedding):
    """``nn.QuantizedEmbedding`` whose tied output head runs on the CPU kernel."""

    def as_linear(self, x: mx.array) -> mx.array:
        return _matmul(self, x)


class KernelRMSNorm(nn.RMSNorm):
    def __call__(self, x: mx.array) -> mx.array:
        return rms_norm(x, self["weight"], self.eps)


class KernelRoPE(nn.RoPE):
    def __call__(self, x: mx.array, offset=0) -> mx.array:
        return rope(x, self.dims, traditional=self.traditional, base=self.base,
                    scale=self.scale, offset=offset)


class KernelLlamaAttention(llama.Attention):
    """mlx-lm's llama attention (same projections, rope and cache), whose single-query steps
    attend on the CPU kernel."""

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        B, L, _ = x.shape
        queries, keys, values = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        queries = queries.reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)
        keys = keys.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        values = values.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        offset = cache.offset if cache is not None else 0
        queries, keys = self.rope(queries, offset=offset), self.rope(keys, offset=offset)
        if cache is not None:
            keys, values = cache.update_and_fetch(keys, values)
        if hasattr(cache, "bits"):  # quantized KV: mlx-lm's own path
            out = scaled_dot_product_attention(queries, keys, values, cache=cache,
                                               scale=self.scale, mask=mask)
        else:
            out = attention(queries, keys, values, self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


def _fits(module) -> bool:
    if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        return (getattr(module, "mode", "affine") == "affine" and module.group_size == GROUP_SIZE
                and module.bits in BITS and module.get("biases") is not None)
    return True


# Leaves first, then the attention modules that hold some of them: each pass retypes modules
# whose children the previous pass has already swapped.
_SWAPS = (
    {nn.QuantizedLinear: KernelQuantizedLinear, nn.QuantizedEmbedding: KernelQuantizedEmbedding,
     nn.RMSNorm: KernelRMSNorm, nn.RoPE: KernelRoPE},
    {llama.Attention: KernelLlamaAttention},
)


def _retyped(module: nn.Module, cls: type) -> nn.Module:
    """A module of class ``cls`` sharing ``module``'s arrays and settings (no copy)."""
    new = cls.__new__(cls)
    nn.Module.__init__(new)
    new.__dict__.update(module.__dict__)
    for key, value in module.items():
        new[key] = value
    return new


def use_cpu_kernels(model: nn.Module) -> int:
    """Route the model's fitting layers through the CPU kernels; returns how many. Does
    nothing (returns 0) where the kernels do not run (see ``kernel_status``)."""
    if not kernel_status().available:
        return 0
    from mlx.utils import tree_unflatten

    count = 0
    for swaps in _SWAPS:
        replaced = []
        for path, module in model.named_modules():
            cls = swaps.get(type(module))  # exact types: subclasses may compute differently
            if cls is not None and _fits(module):
                replaced.append((path, _retyped(module, cls)))
        if replaced:
            model.update_modules(tree_unflatten(replaced))
        count += len(replaced)
    return count


def use_reference_layers(model: nn.Module) -> int:
    """Undo :func:`use_cpu_kernels`: each kernel layer back to MLX's own class, which has
    gradients (the kernels have none), e.g. to train; returns how many."""
    from mlx.utils import tree_unflatten

    back = {kernel: base for swaps in _SWAPS for base, kernel in swaps.items()}
    count = 0
    for swaps in reversed(_SWAPS):  # the attention modules first, then their leaves
        replaced = [(path, _retyped(module, back[type(module)]))
                    for path, module in model.named_modules()
                    if type(module) in back and type(module) in swaps.values()]
        if replaced:
            model.update_modules(tree_unflatten(replaced))
        count += len(replaced)
    return count
