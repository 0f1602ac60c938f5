"""Model layers that compute on the CPU kernels (:mod:`mlx_agent.kernels`).

:func:`use_cpu_kernels` swaps, in place, layers for subclasses that keep the very same arrays
and settings:

- ``nn.QuantizedLinear`` and ``nn.QuantizedEmbedding`` whose layout the kernel reads (affine,
  group size 32, 4 or 8 bits: GGUF Q4_0, Q4_1 and Q8_0 as loaded) compute with
  :func:`~mlx_agent.kernels.quantized_matmul` (the matmul kernel for decode and small
  batches, and with VNNI for prefill chunks too; otherwise dequantize + BLAS for those); a
  tied embedding's output head too. Where the kernel reads it (AVX-512 VNNI, AVX-512 and
  AVX2), each also keeps a copy of its W packed for it
  (:func:`~mlx_agent.kernels.qmatmul.pack`; about 80 MB more for the bundled model),
  which is not a parameter and is not read once the layer's weights change;
- mlx-lm's llama attention and MLP compute their q, k and v (gate and up) projections as
  one kernel node (:func:`~mlx_agent.kernels.quantized_matmuls`);
- ``nn.RMSNorm`` and ``nn.RoPE`` run as one graph node each
  (:mod:`mlx_agent.kernels.norm_rope`) instead of MLX's composed CPU fallbacks;
- mlx-lm's llama ``Attention`` attends decode steps (a batched step's rows too, each from
  its first unpadded key) and causal prefill chunks with
  :func:`mlx_agent.kernels.attention` (one node each) and writes its keys and values to the
  cache in ``kv_dtype``: float16 by default for quantized weights (:data:`DEFAULT_KV_DTYPE`,
  ``$MLX_AGENT_KV_DTYPE``; float32 weights keep a float32 cache),
  which halves the bytes attention reads a token; logits drift from a float32 cache by less
  than 1e-3 relative (tests/test_kv_dtype.py measures it). Everything else about it is
  mlx-lm's;
- mlx-lm's llama decoder layer runs a decode step as two fused kernel nodes around the
  cache update and the attention (:mod:`mlx_agent.kernels.decode_block`; LoRA adapters on
  q, k and v included): about eight graph nodes a layer instead of about twenty-four.

Not promised: other quantization modes, group sizes or RoPE variants (those layers are left
as they are), or bit-identical logits to the float32 reference (they agree to float32
rounding; see tests/test_qmatmul.py).
"""

from __future__ import annotations

import os
import sys

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.base import scaled_dot_product_attention

from ..errors import UserFacingError
from ..kernels import (attention, kernel_status, quantized_matmul, quantized_matmuls, rms_norm,
                       rope, swiglu)
from ..kernels.decode_block import Lora, Rope, attention_inputs, layer_tail
from ..kernels.qmatmul import BITS, GROUP_SIZE, KERNEL_MAX_ROWS, QWeights, pack, reads_packed

KV_DTYPES = ("float16", "float32")
DEFAULT_KV_DTYPE = "float16"
KV_DTYPE_ENV = "MLX_AGENT_KV_DTYPE"


def kv_dtype(requested: str | None = None) -> mx.Dtype:
    """The KV cache dtype of the kernel attention: ``requested``, ``$MLX_AGENT_KV_DTYPE`` or
    :data:`DEFAULT_KV_DTYPE`."""
    choice = requested or os.environ.get(KV_DTYPE_ENV) or DEFAULT_KV_DTYPE
    if choice not in KV_DTYPES:
        raise UserFacingError(f"unknown KV cache dtype {choice!r} (from ${KV_DTYPE_ENV}?); "
                              f"choose one of {', '.join(KV_DTYPES)}")
    return getattr(mx, choice)


def _matmul(layer, x: mx.array) -> mx.array:
    return quantized_matmul(x, layer["weight"], layer["scales"], layer["biases"], layer.bits,
                            packed=_packed(layer))


def _pack_weights(layer: nn.Module) -> None:
    """Keep a copy of ``layer``'s W packed for decode steps (:func:`pack`), with the arrays
    it was made from (not a parameter: saving, LoRA and training see MLX's layout only)."""
    packed = pack(layer["weight"], layer["scales"], layer["biases"], layer.bits)
    if packed is not None:
        object.__setattr__(layer, "_pack",
                           (layer["weight"], layer["scales"], layer["biases"], packed))


def _packed(layer: nn.Module) -> mx.array | None:
    """``layer``'s packed W while its arrays are still the ones packed (weights updated
    since leave the stale copy unread)."""
    got = layer.__dict__.get("_pack")
    if got is None or got[0] is not layer["weight"] or got[1] is not layer["scales"] \
            or got[2] is not layer["biases"]:
        return None
    return got[3]


def _all_packed(layers) -> list[mx.array]:
    """Every layer's packed W, or none (the kernels take all or nothing)."""
    packed = [_packed(layer) for layer in layers]
    return packed if all(p is not None for p in packed) else []


class KernelQuantizedLinear(nn.QuantizedLinear):
    """``nn.QuantizedLinear`` computed by the CPU kernel."""

    def __call__(self, x: mx.array) -> mx.array:
        y = _matmul(self, x)
        return y + self["bias"] if "bias" in self else y


def _plain(*layers: nn.Module) -> bool:
    """Every layer is a :class:`KernelQuantizedLinear` without a bias (no adapter on it)."""
    return all(type(layer) is KernelQuantizedLinear and "bias" not in layer for layer in layers)


def _projections(*layers: nn.Module) -> tuple[list[QWeights], list[Lora], list] | None:
    """The weights of ``layers`` for :func:`~mlx_agent.kernels.decode_block.attention_inputs`,
    each a :class:`KernelQuantizedLinear` without a bias, or mlx-lm's ``LoRALinear`` around
    one in eval mode (no dropout; ``load`` sets it), with their adapters and packed W's (all
    or none); None otherwise. A ``LoRALinear`` exists only once mlx-lm's tuner module is
    imported, so that is where its class is looked up."""
    lora_linear = getattr(sys.modules.get("mlx_lm.tuner.lora"), "LoRALinear", None)
    weights, adapters, linears = [], [], []
    for i, layer in enumerate(layers):
        if lora_linear is not None and type(layer) is lora_linear and not layer.training:
            adapters.append(Lora(i, layer["lora_a"], layer["lora_b"], layer.scale))
            layer = layer["linear"]
        if not _plain(layer):
            return None
        weights.append(_weights(layer))
        linears.append(layer)
    return weights, adapters, _all_packed(linears)


def _float32_norm(norm: nn.Module) -> bool:
    """A :class:`KernelRMSNorm` the fused kernels take (else their reference would run)."""
    return type(norm) is KernelRMSNorm and norm["weight"].dtype == mx.float32


def _weights(layer: KernelQuantizedLinear) -> QWeights:
    return layer["weight"], layer["scales"], layer["biases"], layer.bits


def project(x: mx.array, *layers: nn.Module) -> list[mx.array]:
    """``[layer(x) for layer in layers]``; as one kernel node when every layer is a
    :class:`KernelQuantizedLinear` without a bias."""
    if _plain(*layers):
        return quantized_matmuls(x, [_weights(layer) for layer in layers],
                                 packed=_all_packed(layers))
    return [layer(x) for layer in layers]


class KernelQuantizedEmbedding(nn.QuantizedEmbedding):
    """``nn.QuantizedEmbedding`` whose rows dequantize in float32, as the float32 reference
    holds them and the kernel layers compute (float16 scales would give float16 rows, which
    the first layer's kernels would not take), and whose tied output head runs on the CPU
    kernel."""

    def __call__(self, x: mx.array) -> mx.array:
        return mx.dequantize(self["weight"][x], self["scales"][x].astype(mx.float32),
                             self["biases"][x].astype(mx.float32), group_size=self.group_size,
                             bits=self.bits)

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
    """mlx-lm's llama attention (same projections, rope and cache), whose keys and values are
    cached in ``kv_dtype`` and whose single-query steps attend on the CPU kernel."""

    kv_dtype = mx.float32  # set per instance by use_cpu_kernels

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        offset = cache.offset if cache is not None else 0
        return self.o_proj(self.attend(*self.inputs(x, offset), mask, cache))

    def inputs(self, x: mx.array, offset) -> tuple[mx.array, mx.array, mx.array]:
        """Queries, keys and values ``[B, heads, L, D]``, RoPE applied at ``offset``."""
        queries, keys, values = project(x, self.q_proj, self.k_proj, self.v_proj)
        queries = self._heads(queries, self.n_heads)
        keys, values = self._heads(keys, self.n_kv_heads), self._heads(values, self.n_kv_heads)
        return self.rope(queries, offset=offset), self.rope(keys, offset=offset), values

    def attend(self, queries: mx.array, keys: mx.array, values: mx.array, mask=None,
               cache=None) -> mx.array:
        """The attention's output ``[B, L, heads * D]`` (before ``o_proj``), the keys and
        values first written to ``cache`` in ``kv_dtype``."""
        B, _, L, _ = queries.shape
        if cache is not None:
            keys, values = cache.update_and_fetch(keys.astype(self.kv_dtype),
                                                  values.astype(self.kv_dtype))
        if hasattr(cache, "bits"):  # quantized KV: mlx-lm's own path
            out = scaled_dot_product_attention(queries, keys, values, cache=cache,
                                               scale=self.scale, mask=mask)
        else:  # a batched step's padding mask is the rows' first keys (BatchKVCache's)
            starts = getattr(cache, "left_padding", None) if L == 1 else None
            out = attention(queries, keys, values, self.scale, mask=mask, starts=starts)
        if L == 1:  # [B, heads, 1, D] is already [B, 1, heads * D] in memory: no transpose
            return out.reshape(B, 1, -1)
        return out.transpose(0, 2, 1, 3).reshape(B, L, -1)

    @staticmethod
    def _heads(x: mx.array, heads: int) -> mx.array:
        """``[B, L, heads * D]`` as ``[B, heads, L, D]``; one reshape when L is 1."""
        B, L, _ = x.shape
        if L == 1:
            return x.reshape(B, heads, 1, -1)
        return x.reshape(B, L, heads, -1).transpose(0, 2, 1, 3)


class KernelLlamaMLP(llama.MLP):
    """mlx-lm's llama MLP whose gate and up projections run as one kernel node, and its
    SwiGLU as another (mlx-lm's compiled one is a scalar loop on one thread on the CPU)."""

    def __call__(self, x: mx.array) -> mx.array:
        gate, up = project(x, self.gate_proj, self.up_proj)
        return self.down_proj(swiglu(gate, up))


class KernelLlamaBlock(llama.TransformerBlock):
    """mlx-lm's llama decoder layer. A decode step (one position, float32, at most
    ``KERNEL_MAX_ROWS`` sequences, a cache) runs as two kernel nodes around the cache update
    and the attention (:mod:`mlx_agent.kernels.decode_block`): the norm, q, k and v
    projections (LoRA adapters on them included) and RoPE as one, at one position or at
    each row's of a batch's cache; the output projection, residuals, norm and MLP as the
    other, when no adapter wraps those. Everything else is mlx-lm's layer on the other
    kernel layers."""

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        # Children by item, not attribute: nn.Module's __getattr__ runs in Python, and this
        # runs 30 times a token.
        attn, mlp = self["self_attn"], self["mlp"]
        B, L, _ = x.shape
        if (L != 1 or B > KERNEL_MAX_ROWS or x.dtype != mx.float32 or cache is None
                or hasattr(cache, "bits") or type(attn) is not KernelLlamaAttention
                or type(mlp) is not KernelLlamaMLP):
            return super().__call__(x, mask, cache)
        norm, rope = self["input_layernorm"], attn["rope"]
        qkv = _projections(attn["q_proj"], attn["k_proj"], attn["v_proj"])
        offset = cache.offset  # an integer, or a batch's rows' positions
        if ((isinstance(offset, int) or offset.shape == (B,)) and type(rope) is KernelRoPE
                and _float32_norm(norm) and qkv is not None):
            q, k, v = attention_inputs(
                x, norm["weight"], norm.eps, qkv[0], attn.n_heads, attn.n_kv_heads,
                Rope(rope.dims, rope.traditional, rope.base, rope.scale, offset), attn.kv_dtype,
                qkv[1], packed=qkv[2])
        else:
            q, k, v = attn.inputs(norm(x), offset)
        out = attn.attend(q, k, v, mask, cache)
        norm = self["post_attention_layernorm"]
        tail = attn["o_proj"], mlp["gate_proj"], mlp["up_proj"], mlp["down_proj"]
        if _float32_norm(norm) and _plain(*tail):
            return layer_tail(out, x, norm["weight"], norm.eps, *(_weights(p) for p in tail),
                              packed=_all_packed(tail))
        h = x + attn.o_proj(out)
        return h + mlp(norm(h))


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
    {llama.Attention: KernelLlamaAttention, llama.MLP: KernelLlamaMLP},
    {llama.TransformerBlock: KernelLlamaBlock},
)


def _retyped(module: nn.Module, cls: type) -> nn.Module:
    """A module of class ``cls`` sharing ``module``'s arrays and settings (no copy)."""
    new = cls.__new__(cls)
    nn.Module.__init__(new)
    new.__dict__.update({k: v for k, v in module.__dict__.items() if k != "_pack"})
    for key, value in module.items():
        new[key] = value
    return new


def use_cpu_kernels(model: nn.Module, kv_cache_dtype: mx.Dtype | None = None) -> int:
    """Route the model's fitting layers through the CPU kernels, attention caching keys and
    values in ``kv_cache_dtype`` (default: :func:`kv_dtype`); returns how many layers. Does
    nothing (returns 0) where the kernels do not run (see ``kernel_status``)."""
    if not kernel_status().available:
        return 0
    kv_cache_dtype = kv_cache_dtype or kv_dtype()
    from mlx.utils import tree_unflatten

    count = 0
    for swaps in _SWAPS:
        replaced = []
        for path, module in model.named_modules():
            cls = swaps.get(type(module))  # exact types: subclasses may compute differently
            if cls is not None and _fits(module):
                replaced.append((path, _retyped(module, cls)))
                if cls is KernelLlamaAttention:
                    replaced[-1][1].kv_dtype = kv_cache_dtype
        if replaced:
            model.update_modules(tree_unflatten(replaced))
        count += len(replaced)
    if reads_packed():
        for _, module in model.named_modules():
            if type(module) in (KernelQuantizedLinear, KernelQuantizedEmbedding):
                _pack_weights(module)
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
