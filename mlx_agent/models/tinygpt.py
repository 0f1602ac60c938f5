"""The ``.tinygpt`` architecture as an MLX module that takes mlx-lm's cache objects.

GPT-2 style, as the original trains it: learned absolute positions (no RoPE), pre-LN
blocks with LayerNorm (eps 1e-5), biased q/k/v/o projections, an exact (erf) GELU MLP, a
final LayerNorm and an output head tied to the token embedding. As the original's model
does: ``useEmbeddingRMSNorm`` adds an ``embed_norm`` RMSNorm on the token embedding, before the
positions are added, and ``useDeepNorm`` multiplies the residual by (2 * layers) ** 0.25 before
each sub-layer's output is added to it.

Layout follows mlx-lm's models (args dataclass, blocks, ``Model`` with ``sanitize``), and
``Model.model`` returns the final hidden states so the engine can apply the head to the last
position only. Positions come from the cache offset; past ``ctx`` (possible only with a
rotating cache) they saturate at ``ctx - 1``, because learned absolute positions cannot be
shifted: quality past the trained context is not promised.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import BaseModelArgs, create_attention_mask, scaled_dot_product_attention

UNSUPPORTED_FLAGS = ("slidingWindow", "useYOCO", "nExperts", "useMoE", "useRoPE", "useGQA")
DEFAULT_HEADS = 8  # the original's loader, for a config that leaves heads out


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str = "tinygpt"
    layers: int = 2
    d_model: int = 64
    ctx: int = 128
    heads: int = 4
    d_mlp: int = 256
    vocab_size: int = 256
    embed_norm: bool = False
    deep_norm_alpha: float = 1.0

    @classmethod
    def from_config(cls, config: dict) -> "ModelArgs":
        """From a ``.tinygpt`` header config; raises ValueError naming a flag we can't run."""
        for flag in UNSUPPORTED_FLAGS:
            value = config.get(flag)
            if value and not (flag == "nExperts" and value == 1):  # one expert: dense
                raise ValueError(f"tinygpt config flag {flag}={config[flag]!r} is not supported")
        d, layers = int(config["dModel"]), int(config["layers"])
        args = cls(
            layers=layers, d_model=d, ctx=int(config["ctx"]),
            heads=int(config.get("heads") or DEFAULT_HEADS),
            d_mlp=int(config.get("dMlp") or 4 * d),
            vocab_size=int(config.get("vocabSize") or 256),
            embed_norm=bool(config.get("useEmbeddingRMSNorm")),
            deep_norm_alpha=(2.0 * layers) ** 0.25 if config.get("useDeepNorm") else 1.0,
        )
        if d % args.heads:
            raise ValueError(f"tinygpt dModel {d} is not divisible by heads {args.heads}")
        return args


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        d = args.d_model
        self.heads = args.heads
        self.scale = (d // args.heads) ** -0.5
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.o_proj = nn.Linear(d, d)

    def __call__(self, x: mx.array, mask, cache=None) -> mx.array:
        B, L, D = x.shape

        def heads(t):
            return t.reshape(B, L, self.heads, -1).transpose(0, 2, 1, 3)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, D))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.fc_in = nn.Linear(args.d_model, args.d_mlp)
        self.fc_out = nn.Linear(args.d_mlp, args.d_model)

    def __call__(self, x: mx.array) -> mx.array:
        return self.fc_out(nn.gelu(self.fc_in(x)))  # nn.gelu is the exact erf form


class Block(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.ln1 = nn.LayerNorm(args.d_model, eps=1e-5)
        self.attn = Attention(args)
        self.ln2 = nn.LayerNorm(args.d_model, eps=1e-5)
        self.mlp = MLP(args)
        self.alpha = args.deep_norm_alpha

    def __call__(self, x, mask, cache=None):
        a = self.alpha
        x = (x if a == 1.0 else x * a) + self.attn(self.ln1(x), mask, cache)
        return (x if a == 1.0 else x * a) + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Embeddings, blocks and final norm; returns hidden states."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.token_embedding = nn.Embedding(args.vocab_size, args.d_model)
        self.position_embedding = nn.Embedding(args.ctx, args.d_model)
        if args.embed_norm:
            self.embed_norm = nn.RMSNorm(args.d_model, eps=1e-5)
        self.blocks = [Block(args) for _ in range(args.layers)]
        self.ln_final = nn.LayerNorm(args.d_model, eps=1e-5)

    def __call__(self, inputs: mx.array, cache=None) -> mx.array:
        L = inputs.shape[1]
        offset = cache[0].offset if cache is not None else 0
        if isinstance(offset, mx.array):  # a batched cache: one offset per row
            offset = offset[:, None]
        positions = mx.minimum(offset + mx.arange(L), self.args.ctx - 1)
        h = self.token_embedding(inputs)
        if self.args.embed_norm:
            h = self.embed_norm(h)
        h = h + self.position_embedding(positions)
        if cache is None:
            cache = [None] * len(self.blocks)
        mask = create_attention_mask(h, cache[0])
        for block, c in zip(self.blocks, cache):
            h = block(h, mask, cache=c)
        return self.ln_final(h)


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.model = TinyGPT(args)

    def __call__(self, inputs: mx.array, cache=None) -> mx.array:
        return self.output_head(self.model(inputs, cache))

    def output_head(self, h: mx.array) -> mx.array:
        """Logits from final hidden states: the head is tied to the token embedding."""
        return self.model.token_embedding.as_linear(h)

    @property
    def layers(self):
        return self.model.blocks

    def sanitize(self, weights: dict) -> dict:
        """File tensor names -> module parameter names."""
        return {f"model.{k}": v for k, v in weights.items()}
