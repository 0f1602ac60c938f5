"""Tokenizers for every model format, all behind mlx-lm's ``TokenizerWrapper``.

- GGUF (``tokenizer.ggml.model == "gpt2"``): a ``tokenizers`` byte-level BPE from the file's
  vocabulary and merges, special tokens from ``token_type`` (control = 3, user-defined = 4).
  The pre-tokenizer follows ``tokenizer.ggml.pre``: ``smollm`` splits digits one by one
  before the byte-level split, as llama.cpp does. Other ``pre`` values get GPT-2's split,
  which is not promised to match llama.cpp token for token.
- byte-level (``.tinygpt`` with 256 tokens): id = byte value.
- SentencePiece (a ``.tinygpt`` with an embedded model): a small adapter over
  ``sentencepiece`` that offers the methods mlx-lm's wrapper and detokenizer use.
- Hugging Face directories: mlx-lm's own loader.

Streaming detokenizers are mlx-lm's (O(1) per token). Chat templates are rendered by
:mod:`mlx_agent.chat`, not here.
"""

from __future__ import annotations

import hashlib
from functools import partial
from pathlib import Path

import sentencepiece as spm
from mlx_lm.tokenizer_utils import (
    BPEStreamingDetokenizer,
    SPMStreamingDetokenizer,
    TokenizerWrapper,
    _byte_decoder,
)
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from .chat import CHATML, ChatFormat

_CONTROL, _USER_DEFINED = 3, 4


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (mlx-lm's decoder, inverted)."""
    return {b: c for c, b in _byte_decoder().items()}


def _fast(tok, *, bos: str | None, eos: str | None, unk: str | None = None):
    from transformers import PreTrainedTokenizerFast  # lazy: transformers takes ~2 s

    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, unk_token=unk,
        clean_up_tokenization_spaces=False,
    )


def from_gguf(meta: dict) -> TokenizerWrapper:
    """Build the tokenizer described by a GGUF file's ``tokenizer.ggml.*`` metadata."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')"
        )
    tokens = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    types = [int(t) for t in meta["tokenizer.ggml.token_type"].tolist()] if (
        "tokenizer.ggml.token_type" in meta
    ) else [1] * len(tokens)
    try:
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                   ignore_merges=False, fuse_unk=False))
    except Exception as e:  # tokenizers raises a bare Exception
        raise ValueError(f"GGUF tokenizer is malformed: {e}") from None
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if meta.get("tokenizer.ggml.pre") == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False)
         for t, ty in zip(tokens, types) if ty in (_CONTROL, _USER_DEFINED)]
    )

    def name(key):
        i = meta.get(key)
        return tokens[int(i.item())] if i is not None else None

    fast = _fast(tok, bos=name("tokenizer.ggml.bos_token_id"),
                 eos=name("tokenizer.ggml.eos_token_id"),
                 unk=name("tokenizer.ggml.unknown_token_id"))
    return TokenizerWrapper(fast, BPEStreamingDetokenizer)


def byte_level() -> TokenizerWrapper:
    """256 tokens, id = byte value; no special tokens (the original's byte-level models)."""
    chars = _bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return TokenizerWrapper(_fast(tok, bos=None, eos=None), BPEStreamingDetokenizer)


class SentencePieceTokenizer:
    """The subset of a Hugging Face tokenizer that mlx-lm and mlx_agent use, over SentencePiece."""

    def __init__(self, model_proto: bytes):
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.model_proto = model_proto
        piece = self.sp.id_to_piece
        self.bos_token_id = self.sp.bos_id() if self.sp.bos_id() >= 0 else None
        self.eos_token_id = self.sp.eos_id() if self.sp.eos_id() >= 0 else None
        self.bos_token = piece(self.bos_token_id) if self.bos_token_id is not None else None
        self.eos_token = piece(self.eos_token_id) if self.eos_token_id is not None else None
        self.chat_template = None
        self.clean_up_tokenization_spaces = False

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str, add_special_tokens: bool = False,
               split_special_tokens: bool = False) -> list[int]:
        # control pieces never match text in SentencePiece: splitting is always on
        ids = self.sp.encode(text)
        if add_special_tokens and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.sp.decode(list(ids))

    def convert_ids_to_tokens(self, ids):
        return [self.sp.id_to_piece(int(i)) for i in ids]

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.sp.piece_to_id(token)

    def get_vocab(self) -> dict[str, int]:
        return {self.sp.id_to_piece(i): i for i in range(len(self))}

    @property
    def vocab(self) -> dict[str, int]:
        return self.get_vocab()

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False,
                            tokenize=True, **extra):
        """Rendered by :mod:`mlx_agent.chat` (ChatML unless a template is set)."""
        text = ChatFormat(self.chat_template or CHATML).render(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, **extra)
        return self.encode(text) if tokenize else text


def from_sentencepiece(model_proto: bytes) -> TokenizerWrapper:
    tok = SentencePieceTokenizer(model_proto)
    return TokenizerWrapper(tok, partial(SPMStreamingDetokenizer, trim_space=True))


def from_hf_dir(path: Path) -> TokenizerWrapper:
    from mlx_lm.utils import load_tokenizer  # lazy: mlx_lm.utils takes seconds

    return load_tokenizer(Path(path))


def special_tokens(tokenizer: TokenizerWrapper) -> list[str]:
    """The strings that encode to special (added or control) tokens."""
    inner = tokenizer._tokenizer
    if isinstance(inner, SentencePieceTokenizer):
        sp = inner.sp
        return [sp.id_to_piece(i) for i in range(len(inner)) if sp.is_control(i)]
    added = getattr(inner, "added_tokens_decoder", {}) or {}
    names = {str(t) for t in added.values() if getattr(t, "special", True)}
    names.update(getattr(inner, "all_special_tokens", []) or [])
    return sorted(n for n in names if n)


def vocab_hash(tokenizer: TokenizerWrapper) -> str:
    """SHA-256 (hex, 16 chars) over the id -> token string table."""
    inner = tokenizer._tokenizer
    h = hashlib.sha256()
    for t in inner.convert_ids_to_tokens(list(range(len(inner)))):
        h.update((t or "").encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()[:16]
