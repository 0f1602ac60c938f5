"""GGUF files (llama architecture) into mlx-lm's llama model.

``mx.load`` reads the file natively: F32 and F16 tensors as arrays, Q4_0, Q4_1 and Q8_0 as
MLX affine-quantized triples (``weight`` packed uint32, ``scales``, ``biases``; group size
32). We map llama.cpp's tensor names to mlx-lm's, build ``ModelArgs`` from the ``llama.*``
metadata, and quantize exactly the layers that arrive quantized, with the bit width each
one has. llama.cpp stores q/k rows permuted for its interleaved RoPE, hence
``rope_traditional=True``.

Not promised: architectures other than ``llama`` (a clear error names the one found), the
K-quants and other GGUF tensor types that ``mx.load`` does not read (likewise).
"""

from __future__ import annotations

import re
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

from . import gguf_header

GROUP_SIZE = 32  # every GGUF block type MLX reads has 32-element blocks

_NAMES = [
    (r"^token_embd\.", "model.embed_tokens."),
    (r"^output_norm\.", "model.norm."),
    (r"^output\.", "lm_head."),
    (r"^blk\.(\d+)\.attn_q\.", r"model.layers.\1.self_attn.q_proj."),
    (r"^blk\.(\d+)\.attn_k\.", r"model.layers.\1.self_attn.k_proj."),
    (r"^blk\.(\d+)\.attn_v\.", r"model.layers.\1.self_attn.v_proj."),
    (r"^blk\.(\d+)\.attn_output\.", r"model.layers.\1.self_attn.o_proj."),
    (r"^blk\.(\d+)\.attn_norm\.", r"model.layers.\1.input_layernorm."),
    (r"^blk\.(\d+)\.ffn_norm\.", r"model.layers.\1.post_attention_layernorm."),
    (r"^blk\.(\d+)\.ffn_gate\.", r"model.layers.\1.mlp.gate_proj."),
    (r"^blk\.(\d+)\.ffn_up\.", r"model.layers.\1.mlp.up_proj."),
    (r"^blk\.(\d+)\.ffn_down\.", r"model.layers.\1.mlp.down_proj."),
]
_SKIP = re.compile(r"^rope_freqs\.|\.attn_rot_embd\.")


class GGUFError(ValueError):
    """A GGUF file we cannot load, with the reason in one line."""


def _rename(name: str) -> str | None:
    if _SKIP.search(name):
        return None
    for pattern, repl in _NAMES:
        new, n = re.subn(pattern, repl, name)
        if n:
            return new
    raise GGUFError(f"unexpected tensor {name!r} for a llama GGUF")


def read(path: Path) -> tuple[dict[str, mx.array], dict]:
    try:  # first: the native reader trusts the header, and crashed the process on some
        gguf_header.check(path)
    except gguf_header.HeaderError as e:
        raise GGUFError(f"{path} is not a readable GGUF file ({e})") from None
    except OSError as e:
        raise GGUFError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        weights, meta = mx.load(str(path), format="gguf", return_metadata=True)
    except Exception as e:  # MLX raises bare exceptions for malformed or unsupported files
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "type" in msg.lower() and "support" in msg.lower():
            raise GGUFError(f"{path}: unsupported GGUF tensor type ({msg})") from None
        raise GGUFError(f"{path} is not a readable GGUF file ({msg})") from None
    return weights, meta


def _int(meta: dict, key: str, default=None):
    v = meta.get(key)
    if v is None:
        if default is None:
            raise GGUFError(f"GGUF metadata lacks {key}")
        return default
    return v.item() if isinstance(v, mx.array) else v


# what a llama GGUF's metadata may say: a 400-byte file claiming 5,000,000 blocks built
# layers until the memory ran out, and a head count of 0 divided by zero
_LIMITS = {"llama.attention.head_count": 1024, "llama.attention.head_count_kv": 1024,
           "llama.embedding_length": 1 << 16, "llama.block_count": 4096,
           "llama.feed_forward_length": 1 << 18, "llama.vocab_size": 1 << 22,
           "llama.attention.key_length": 1 << 12, "llama.context_length": 1 << 22}


def _check_limits(meta: dict) -> None:
    for key, most in _LIMITS.items():
        if key in meta:
            value = _int(meta, key)
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if not (isinstance(value, int) and 1 <= value <= most):
                raise GGUFError(f"GGUF metadata {key} is {value!r}, not a whole number from 1 "
                                f"to {most:,}")


_SPECIAL_IDS = ("bos", "eos", "unknown", "padding")


def _check_vocab(meta: dict, rows: int) -> None:
    """The tokenizer must fit the embedding: a token id past its rows, or a special token id
    past the vocabulary, read memory that is not the model's (a segfault, or garbage)."""
    tokens = meta.get("tokenizer.ggml.tokens", [])
    if not isinstance(tokens, list):
        raise GGUFError("GGUF metadata tokenizer.ggml.tokens is not a list of strings")
    if len(tokens) > rows:
        raise GGUFError(f"the tokenizer has {len(tokens):,} tokens but the embedding "
                        f"{rows:,} rows (a token past them would read outside the model)")
    types = meta.get("tokenizer.ggml.token_type")
    if types is not None and (not isinstance(types, mx.array) or types.ndim != 1
                              or types.size != len(tokens)):
        size = types.size if isinstance(types, mx.array) else type(types).__name__
        raise GGUFError(f"GGUF metadata tokenizer.ggml.token_type has {size} entries for "
                        f"{len(tokens):,} tokens")
    for name in _SPECIAL_IDS:
        key = f"tokenizer.ggml.{name}_token_id"
        v = meta.get(key)
        if v is None:
            continue
        ok = isinstance(v, mx.array) and v.size == 1 and mx.issubdtype(v.dtype, mx.integer)
        if not ok or not 0 <= int(v.item()) < len(tokens):
            shown = v.item() if ok else (v.tolist() if isinstance(v, mx.array) else v)
            raise GGUFError(f"GGUF metadata {key} is {str(shown)[:40]}, not a token id from 0 "
                            f"to {len(tokens) - 1:,}")


def _finite(meta: dict, key: str, default: float, low: float, high: float) -> float:
    v = meta.get(key)
    if v is None:
        return default
    value = v.item() if isinstance(v, mx.array) and v.size == 1 else v
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not low < float(value) <= high:  # NaN fails every comparison
        raise GGUFError(f"GGUF metadata {key} is {str(value)[:40]}, not a finite number above "
                        f"{low:g} and at most {high:g}")
    return float(value)


def model_args(meta: dict) -> llama.ModelArgs:
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise GGUFError(f"GGUF architecture {arch!r} is not supported (only 'llama')")
    _check_limits(meta)
    heads = int(_int(meta, "llama.attention.head_count"))
    hidden = int(_int(meta, "llama.embedding_length"))
    n_vocab = len(meta.get("tokenizer.ggml.tokens", [])) or None
    vocab_size = int(_int(meta, "llama.vocab_size", n_vocab))
    _check_vocab(meta, vocab_size)
    return llama.ModelArgs(
        model_type="llama",
        hidden_size=hidden,
        num_hidden_layers=int(_int(meta, "llama.block_count")),
        intermediate_size=int(_int(meta, "llama.feed_forward_length")),
        num_attention_heads=heads,
        num_key_value_heads=int(_int(meta, "llama.attention.head_count_kv", heads)),
        rms_norm_eps=_finite(meta, "llama.attention.layer_norm_rms_epsilon", 1e-5, 0, 1),
        vocab_size=vocab_size,
        head_dim=int(_int(meta, "llama.attention.key_length", hidden // heads)),
        max_position_embeddings=int(_int(meta, "llama.context_length", 2048)),
        rope_theta=_finite(meta, "llama.rope.freq_base", 10000.0, 0, 1e12),
        rope_traditional=True,
        tie_word_embeddings=True,  # fixed below from the tensors present
    )


def build(weights: dict[str, mx.array], meta: dict) -> tuple[nn.Module, llama.ModelArgs]:
    """An mlx-lm llama model holding the file's weights, quantized layers kept quantized."""
    args = model_args(meta)
    renamed = {}
    for name, w in weights.items():
        new = _rename(name)
        if new is not None:
            renamed[new] = w
    args.tie_word_embeddings = "lm_head.weight" not in renamed
    blocks = {name.split(".")[2] for name in renamed if name.startswith("model.layers.")}
    if args.num_hidden_layers > len(blocks):  # before building them
        raise GGUFError(f"GGUF metadata says {args.num_hidden_layers} blocks, and the file "
                        f"holds tensors for {len(blocks)}")
    model = llama.Model(args)

    def bits_of(path: str) -> int | None:
        scales = renamed.get(f"{path}.scales")
        if scales is None:
            return None
        return renamed[f"{path}.weight"].shape[-1] // scales.shape[-1]

    def predicate(path, module):
        bits = bits_of(path)
        if bits is None or not hasattr(module, "to_quantized"):
            return False
        return {"group_size": GROUP_SIZE, "bits": bits}

    nn.quantize(model, class_predicate=predicate)
    try:
        model.load_weights(list(renamed.items()), strict=True)
    except ValueError as e:
        raise GGUFError(f"GGUF tensors do not fit a llama model: {e}") from None
    return model, args
