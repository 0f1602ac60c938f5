"""Load a model from any spec: a GGUF file, a Hugging Face directory, a ``.tinygpt`` file or a
name (:mod:`.registry` resolves names). See :mod:`mlx_agent.models`."""

from __future__ import annotations

import json
import math
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache
from mlx_lm.tokenizer_utils import TokenizerWrapper

from .. import blas
from .. import tokenizer as tok
from ..chat import CHATML, ChatFormat
from ..engine import Engine
from ..fileio import read_regular
from ..kernels import kernel_status
from . import gguf, tinygpt, tinygpt_format
from .cpu_layers import use_cpu_kernels
from .identity import ModelIdentity, dir_fingerprint, file_fingerprint
from .registry import (MAX_LORA_RANK, NAMED_MODELS, WEIGHT_FORMATS, WEIGHTS_ENV, ModelError,
                       default_spec, resolve)

# transformers passes split_special_tokens by setting a flag on the shared Rust tokenizer for
# the call: encodes in two threads at once (eval --batch) must not interleave.
_ENCODING = threading.Lock()


class _Parts(NamedTuple):
    """What each format's loader hands to :func:`load`."""

    model: nn.Module
    tokenizer: TokenizerWrapper
    template: str
    context_length: int
    name: str
    bos_id: int | None = None  # set when the file says prompts start with BOS


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: TokenizerWrapper
    chat: ChatFormat
    stop_ids: frozenset[int]  # the end of a turn: what written rows train, the grammar's EOS
    context_length: int
    identity: ModelIdentity
    path: Path
    bos_id: int | None = None  # prepended to prompts when the model asks for it
    vocab_size: int = 0  # width of the logits (may exceed the tokenizer's vocabulary)
    # what a generation stops at: stop_ids and the special tokens no reply goes on past
    # (:data:`REPLY_ENDS`); a reply cut at one is closed as if it had ended its turn
    end_ids: frozenset[int] = frozenset()

    def __post_init__(self):
        self.end_ids = self.end_ids | self.stop_ids

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens written in the text are matched."""
        with _ENCODING:
            return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of message text: special tokens written in it are plain text."""
        with _ENCODING:
            return self.tokenizer.encode(text, add_special_tokens=False,
                                         split_special_tokens=True)

    def prompt_ids(self, text: str) -> list[int]:
        """Ids to feed for a prompt: ``encode(text)`` with the BOS token in front when the
        model wants one and the text (say, a chat template) did not already write it."""
        ids = self.encode(text)
        if self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids))

    def engine(self, **options) -> Engine:
        """An :class:`~mlx_agent.engine.Engine` for this model; ``options`` as Engine takes."""
        ident = self.identity
        options.setdefault("context_length", self.context_length)
        kv_spec = (ident.kv_heads, ident.head_dim, getattr(mx, ident.kv_dtype))
        return Engine(self.model, kv_spec=kv_spec, **options)


def _one_line(message: str, most: int = 3) -> str:
    """mlx-lm's multi-line message as one line: its head, then at most ``most`` of its
    items (``incompatible tensors: a: ... does not match ...; b: ...; and 40 more``)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) <= 1:
        return "".join(lines)
    head, items = lines[0], lines[1:]
    more = f"; and {len(items) - most} more" if len(items) > most else ""
    return f"{head} {'; '.join(items[:most])}{more}"


def _format_of(path: Path) -> str:
    if path.is_dir():
        if (path / "config.json").is_file():
            return "hf"
        raise ModelError(f"{path} is a directory without config.json (not a Hugging Face model)")
    try:  # a FIFO or a device would block, or never end
        magic = read_regular(path, 4)
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror or e}") from None
    if magic == b"GGUF":
        return "gguf"
    if magic == b"TGPT":
        return "tinygpt"
    raise ModelError(
        f"{path}: unknown model format (expected a GGUF file, a .tinygpt file,"
        " or a Hugging Face directory)"
    )


def resolve_weight_format(requested: str | None, quantized_model: bool = True) -> str:
    """The weight format to use: an explicit choice, $MLX_AGENT_WEIGHTS, or auto for this
    device and model (a float model on a CPU computes in float32)."""
    choice = requested or os.environ.get(WEIGHTS_ENV) or "auto"
    if choice not in WEIGHT_FORMATS:
        raise ModelError(f"unknown weight format {choice!r}; choose one of {', '.join(WEIGHT_FORMATS)}")
    if choice == "auto":
        fast = mx.metal.is_available() or (quantized_model and kernel_status().available)
        return "quantized" if fast else "float32"
    return choice


def weight_path(requested: str | None = None) -> str:
    """One line: the weight format in use, the code that computes with it, and why."""
    choice = resolve_weight_format(requested)
    if mx.metal.is_available():
        return f"{choice} on Metal"
    status = kernel_status()
    if choice == "quantized":
        if status.available:
            return f"quantized on the {status.describe()}"
        return f"quantized on MLX's quantized matmul (CPU kernel not used: {status.reason})"
    if status.available:
        return f"float32 on the BLAS (as asked; the {status.describe()} takes quantized)"
    return f"float32 on the BLAS (CPU kernel not used: {status.reason})"


def _apply_weight_format(model: nn.Module, requested: str | None) -> str:
    """Dequantize to float32 when asked (or when that is the fast path here); returns the
    format now in use."""
    quantized = any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
                    for _, m in model.named_modules())
    choice = resolve_weight_format(requested, quantized_model=quantized)
    if choice == "float32":
        model.set_dtype(mx.float32)  # first: float32 scales dequantize exactly, not via float16
        if quantized:
            from mlx_lm.utils import dequantize_model

            dequantize_model(model)
    if not mx.metal.is_available():  # float32 weights keep a float32 KV cache too
        use_cpu_kernels(model, kv_cache_dtype=mx.float32 if choice == "float32" else None)
    if choice == "float32":
        return "float32"
    return "quantized" if quantized else str(_first_float_dtype(model))


def _first_float_dtype(model: nn.Module):
    for _, p in tree_flatten(model.parameters()):
        if mx.issubdtype(p.dtype, mx.floating):
            return str(p.dtype).removeprefix("mlx.core.")
    return "unknown"


def _load_gguf(path: Path):
    try:
        weights, meta = gguf.read(path)
        model, args = gguf.build(weights, meta)
        tokenizer = tok.from_gguf(meta)
        add_bos = meta.get("tokenizer.ggml.add_bos_token")
        bos = meta.get("tokenizer.ggml.bos_token_id")
        bos_id = int(bos.item()) if add_bos is not None and bool(add_bos.item()) and \
            bos is not None else None
        if bos_id is not None and not 0 <= bos_id < args.vocab_size:
            raise gguf.GGUFError(f"GGUF bos_token_id {bos_id} is past the vocabulary")
    except (gguf.GGUFError, ValueError) as e:
        raise ModelError(str(e) if str(path) in str(e) else f"{path}: {e}") from None
    except (TypeError, AttributeError, IndexError, KeyError, OverflowError,
            ZeroDivisionError) as e:  # metadata of the wrong kind (a hostile file)
        raise ModelError(f"{path}: its metadata is not as a llama GGUF's "
                         f"({type(e).__name__}: {e})") from None
    template = meta.get("tokenizer.chat_template") or CHATML
    return _Parts(model, tokenizer, template, args.max_position_embeddings, path.stem, bos_id)


def _load_tinygpt(path: Path):
    try:
        f = tinygpt_format.read(path)
        args = tinygpt.ModelArgs.from_config(f.config)
    except ValueError as e:
        raise ModelError(str(e) if str(path) in str(e) else f"{path}: {e}") from None
    model = tinygpt.Model(args)
    weights = model.sanitize({k: mx.array(v) for k, v in f.weights.items()})
    model.load_weights(list(weights.items()), strict=True)
    if f.sentencepiece is not None:
        try:
            tokenizer = tok.from_sentencepiece(f.sentencepiece)
        except RuntimeError as e:  # sentencepiece's own, for a model it cannot parse
            raise ModelError(f"{path}: its embedded SentencePiece model cannot be read "
                             f"({str(e).splitlines()[0][:120]})") from None
    elif f.config.get("tokenizerSource"):
        source = Path(str(f.config["tokenizerSource"])).expanduser()
        if not source.is_absolute():
            source = path.parent / source
        if not source.is_dir():
            raise ModelError(f"{path}: tokenizerSource {source} is not a directory")
        try:
            tokenizer = tok.from_hf_dir(source)
        except (ValueError, OSError) as e:
            raise ModelError(f"{path}: tokenizerSource {source} holds no usable tokenizer "
                             f"({str(e).splitlines()[0][:120] if str(e) else type(e).__name__})"
                             ) from None
    else:
        if args.vocab_size != 256:
            raise ModelError(
                f"{path}: vocabSize {args.vocab_size} needs a tokenizer (tokenizerSource or an"
                " embedded SentencePiece model)"
            )
        tokenizer = tok.byte_level()
    n_tokens = len(tokenizer._tokenizer)
    if n_tokens > args.vocab_size:  # a token id past the rows reads outside the embedding
        raise ModelError(f"{path}: the tokenizer has {n_tokens:,} tokens but the embedding "
                         f"{args.vocab_size:,} rows (vocabSize)")
    template = getattr(tokenizer, "chat_template", None) or CHATML
    name = f.header.get("name")  # named in prompt-cache files: a string, or the file's stem
    return _Parts(model, tokenizer, template, args.ctx,
                  name if isinstance(name, str) and name.strip() else path.stem)


def _load_hf(path: Path, adapter: Path | None):
    from mlx_lm.utils import load as mlx_lm_load  # lazy: mlx_lm.utils takes seconds

    try:  # mlx-lm unpacks it with ** (a list was a TypeError traceback)
        config = json.loads(read_regular(path / "config.json", max_bytes=MAX_ADAPTER_CONFIG))
    except OSError as e:
        raise ModelError(f"{path}: config.json cannot be read: {e.strerror or e}") from None
    except (ValueError, RecursionError) as e:
        raise ModelError(f"{path}: config.json is not valid JSON "
                         f"({str(e).splitlines()[0][:80] or type(e).__name__})") from None
    if not isinstance(config, dict):
        raise ModelError(f"{path}: config.json is {type(config).__name__}, not an object")
    ctx = config.get("max_position_embeddings") or config.get("max_seq_len") or 4096
    if type(ctx) is not int or not 1 <= ctx <= 1 << 22:
        raise ModelError(f"{path}: config.json max_position_embeddings is "
                         f"{json.dumps(ctx)[:40]}, not a whole number from 1 to {1 << 22:,}")
    try:
        model, tokenizer, config = mlx_lm_load(
            str(path), adapter_path=str(adapter) if adapter else None, return_config=True
        )
    except Exception as e:  # MLX (RuntimeError for a truncated safetensors), mlx-lm,
        # transformers and huggingface_hub each raise their own kinds for a bad folder
        msg = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise ModelError(f"{path}: {msg}") from None
    template = getattr(tokenizer, "chat_template", None) or CHATML
    inner = tokenizer._tokenizer
    bos_id = getattr(inner, "bos_token_id", None)
    if bos_id is not None and inner.encode("a", add_special_tokens=True)[:1] != [bos_id]:
        bos_id = None  # the tokenizer itself does not start prompts with BOS
    return _Parts(model, tokenizer, template, int(ctx), path.name, bos_id)


def _check_adapter_weights(adapter, adapter_path: Path) -> None:
    """adapters.safetensors must be a regular file: MLX opens it blocking (a FIFO waited
    forever) and raised tracebacks for a folder or a dangling link."""
    try:
        mode = os.stat(adapter_path / "adapters.safetensors").st_mode
    except OSError:
        raise ModelError(f"adapter {adapter} has no adapters.safetensors (mlx-lm adapter "
                         "format)") from None
    if not stat.S_ISREG(mode):
        raise ModelError(f"adapter {adapter}: adapters.safetensors is not a regular file")


MAX_ADAPTER_CONFIG = 1 << 20
MAX_ADAPTER_LAYERS = 4096  # as a GGUF's llama.block_count


def _check_adapter_config(adapter, adapter_path: Path) -> None:
    """adapter_config.json as mlx-lm reads it, each field's type and range checked first: a
    list, a null, a missing num_layers, a rank of 2^40 or a string scale were tracebacks
    from inside mlx-lm, and a NaN scale gave garbage."""
    def bad(what: str):
        return ModelError(f"adapter {adapter}: adapter_config.json {what}")

    try:
        config = json.loads(read_regular(adapter_path / "adapter_config.json",
                                         max_bytes=MAX_ADAPTER_CONFIG))
    except OSError as e:
        raise bad(f"cannot be read: {e.strerror or e}") from None
    except RecursionError:
        raise bad("is nested too deeply") from None
    except ValueError as e:  # not UTF-8, not JSON
        raise bad(f"is not valid JSON ({str(e).splitlines()[0][:80]})") from None
    if not isinstance(config, dict):
        raise bad(f"is {type(config).__name__}, not an object")
    kind = config.get("fine_tune_type", "lora")
    if kind not in ("lora", "dora", "full"):
        raise bad(f"fine_tune_type {json.dumps(kind)[:40]} is not lora, dora or full")
    if kind == "full":
        return

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    layers = config.get("num_layers")
    if type(layers) is not int or not (layers == -1 or 1 <= layers <= MAX_ADAPTER_LAYERS):
        raise bad(f"num_layers is {json.dumps(layers)[:40]}, not -1 (all) or a whole number "
                  f"from 1 to {MAX_ADAPTER_LAYERS:,}")
    lora = config.get("lora_parameters")
    if not isinstance(lora, dict):
        raise bad(f"lora_parameters is {json.dumps(lora)[:40]}, not an object")
    rank, scale, dropout = lora.get("rank"), lora.get("scale"), lora.get("dropout")
    if type(rank) is not int or not 1 <= rank <= MAX_LORA_RANK:
        raise bad(f"rank is {json.dumps(rank)[:40]}, not a whole number from 1 to "
                  f"{MAX_LORA_RANK:,}")
    if not number(scale):
        raise bad(f"scale is {json.dumps(scale)[:40]}, not a finite number")
    if not (number(dropout) and 0 <= dropout < 1):
        raise bad(f"dropout is {json.dumps(dropout)[:40]}, not a number from 0 up to 1")
    keys = lora.get("keys")
    if keys is not None and not (isinstance(keys, list)
                                 and all(isinstance(k, str) for k in keys)):
        raise bad(f"keys is {json.dumps(keys)[:40]}, not a list of layer names")


def _probe(model: nn.Module, source: str,
           adapter_weights: Path | None = None) -> tuple[str, int, int, int]:
    """KV dtype, kv heads, head dim and logits width, read off a one-token forward pass.

    The pass reads every layer's weights and the output head, so a NaN or an infinity in any
    of them (a damaged file) shows in its logits: refused here, where the model went on to
    write the same token over and over. Of an embedding table it reads one row (a tied one
    is the head too), so the tables are checked whole beside it. Only then are the weights
    searched, to name one, and the file it came from (``adapter_weights``, or the model's)."""
    cache = [KVCache() for _ in model.layers]
    logits = model(mx.array([[0]]), cache=cache)
    keys = cache[0].keys
    finite = mx.isfinite(logits).all()
    for _, module in model.named_modules():
        if isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)):
            for _, p in tree_flatten(module.parameters()):
                if mx.issubdtype(p.dtype, mx.floating):
                    finite = finite & mx.isfinite(p).all()
    mx.eval(keys, logits, finite)
    if not finite.item():
        bad = next((name for name, p in tree_flatten(model.parameters())
                    if mx.issubdtype(p.dtype, mx.floating) and not mx.isfinite(p).all().item()),
                   None)
        where = f" ({bad})" if bad else ""
        # its names, not its data (MLX loads lazily): a DoRA magnitude or a full fine-tune's
        # weight is the adapter's too, though its name holds no "lora"
        ours = bad is not None and adapter_weights is not None and \
            bad in mx.load(str(adapter_weights))
        damaged = "the adapter is" if ours else "the file is"
        raise ModelError(f"{source}: the weights hold NaN or infinite values{where}, so the "
                         f"model cannot compute; {damaged} damaged: download or make it again")
    return str(keys.dtype).removeprefix("mlx.core."), keys.shape[1], keys.shape[3], logits.shape[-1]


def load(
    spec: str | os.PathLike | None = None,
    *,
    adapter: str | os.PathLike | None = None,
    weights: str | None = None,
    context_length: int | None = None,
) -> LoadedModel:
    """Load ``spec`` (default: ``$MLX_AGENT_MODEL`` or ``smollm2-135m``)."""
    blas.activate()
    spec = str(spec) if spec is not None else default_spec()
    path = resolve(spec)
    fmt = _format_of(path)
    adapter_path = Path(adapter).expanduser() if adapter else None
    if adapter_path is not None and not os.path.isdir(adapter_path):  # os.path: no raising
        raise ModelError(f"adapter {adapter} does not exist" if not os.path.exists(adapter_path)
                         else f"adapter {adapter} is not a directory (mlx-lm adapter format)")
    if adapter_path is not None and not (adapter_path / "adapter_config.json").is_file():
        raise ModelError(f"adapter {adapter} has no adapter_config.json (mlx-lm adapter format)")
    if adapter_path is not None:
        _check_adapter_weights(adapter, adapter_path)
        _check_adapter_config(adapter, adapter_path)
    if fmt == "gguf":
        parts = _load_gguf(path)
    elif fmt == "tinygpt":
        parts = _load_tinygpt(path)
    else:
        parts = _load_hf(path, adapter_path)
    model, tokenizer, template, max_ctx, name, bos_id = parts
    weight_format = _apply_weight_format(model, weights)
    if adapter_path is not None and fmt != "hf":  # mlx_lm.load applied it for "hf"
        from mlx_lm.tuner.utils import load_adapters  # lazy: mlx_lm.tuner takes seconds

        try:
            load_adapters(model, str(adapter_path))
        except (ValueError, OSError, KeyError, RuntimeError, TypeError, AttributeError,
                OverflowError) as e:  # MLX raises RuntimeError for a corrupt safetensors
            raise ModelError(f"adapter {adapter_path} does not fit {path.name}: "
                             f"{_one_line(str(e)) or type(e).__name__}") from None
    model.eval()
    mx.eval(model.parameters())  # dequantize and cast now, not inside the first prefill

    if context_length is not None:
        if context_length <= 0:
            raise ModelError(f"context length must be a positive number of tokens, got {context_length}")
        if fmt == "tinygpt" and context_length > max_ctx:
            raise ModelError(f"{path.name} has learned positions for {max_ctx} tokens; "
                             f"context length {context_length} is too long")
        max_ctx = context_length

    if spec in NAMED_MODELS:
        name = spec
    inner = tokenizer._tokenizer
    chat = ChatFormat(template=template, bos_token=getattr(inner, "bos_token", None) or "",
                      eos_token=getattr(inner, "eos_token", None) or "")
    source = f"{path}" + (f" with adapter {adapter}" if adapter_path else "")
    kv_dtype, kv_heads, head_dim, vocab_size = _probe(
        model, source, adapter_path / "adapters.safetensors" if adapter_path else None)
    identity = ModelIdentity(
        name=name, format=fmt,
        fingerprint=dir_fingerprint(path) if path.is_dir() else file_fingerprint(path),
        adapter_fingerprint=dir_fingerprint(adapter_path) if adapter_path else "",
        vocab_hash=tok.vocab_hash(tokenizer), num_layers=len(model.layers),
        kv_dtype=kv_dtype, kv_heads=kv_heads, head_dim=head_dim, weight_format=weight_format,
    )
    return LoadedModel(model=model, tokenizer=tokenizer, chat=chat,
                       stop_ids=frozenset(tokenizer.eos_token_ids), context_length=max_ctx,
                       identity=identity, path=path, bos_id=bos_id, vocab_size=vocab_size,
                       end_ids=_reply_ends(tokenizer))


# Special tokens no reply goes on past, besides the model's end of turn: a ChatML model that
# writes <|im_start|> has begun a turn of its own (the next user's, made up), and
# <|endoftext|> ends a pretraining document. Neither stopped a reply: a chat completion's
# content went on with "<|im_start|>user\n...". llama.cpp ends generation at such tokens (its
# end-of-generation set), and Ollama's ChatML models stop at <|im_start|>. They stop
# generation only: the turn's trained end stays ``stop_ids`` (written rows, the grammar).
REPLY_ENDS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>")


def _reply_ends(tokenizer: TokenizerWrapper) -> frozenset[int]:
    """Each of :data:`REPLY_ENDS` that is one special token of this tokenizer, by id."""
    specials = set(tok.special_tokens(tokenizer))
    ids = set()
    for text in REPLY_ENDS:
        if text in specials:
            with _ENCODING:
                encoded = tokenizer.encode(text, add_special_tokens=False)
            if len(encoded) == 1:
                ids.add(encoded[0])
    return frozenset(ids)
