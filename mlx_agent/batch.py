"""Batched decoding: many sequences, one forward pass per token, each with its own rules.

A :class:`BatchDecoder` decodes the sequences of several :class:`~mlx_agent.engine.Engine`
objects together. A sequence joins with its engine (prefilled as usual, so its prompt, its
reused prefix and the logits after its last token are the engine's), its own sampler, stop
ids, token limit and grammar constraint. Each :meth:`BatchDecoder.step` then

- masks every constrained row's logits with its grammar in one batched op (unconstrained
  rows get an all-allowed mask), takes the argmax of every greedy row in one op, and draws
  each sampling row with its own sampler (and so its own seed);
- feeds the new tokens to the model in one forward pass over mlx-lm's
  :class:`~mlx_lm.models.cache.BatchKVCache` (left-padded rows), queued with
  ``mx.async_eval`` before the tokens are read back, as the engine queues step n+1 (the
  tokens evaluated on their own first: reading back an array waits for everything queued
  with it). When every row is greedy and unconstrained, the next tokens' argmax is queued
  with the forward pass, as mlx-lm's ``BatchGenerator`` queues its sampling;
- retires the rows that finished (a stop id, the grammar's end, their token limit): their
  keys and values go back into their engine's own cache, so ``engine.tokens`` is again
  exactly what that cache holds (the last token included) and the engine goes on alone.

The other rows are untouched by a row leaving or joining: mlx-lm's ``filter`` and
``extend`` move whole rows and keep every row's positions and mask.

Not promised: bit-identical logits to a sequence decoded alone (a batched step multiplies B
rows at once and attends through a padding mask; results agree to float32 rounding, so a
near-tie between two tokens may break differently), rotating or hybrid caches (engines in
``rotating`` mode, or models with their own cache layout, cannot join), or thread safety.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import BatchKVCache, KVCache

from .cache import ContextFull
from .engine import Constraint, Engine, Sampler, greedy_sampler
from .grammar import GrammarError
from .kernels import apply_bitmask


class CannotBatch(ValueError):
    """An engine whose cache cannot take part in a batch."""


@dataclass(eq=False)
class Row:
    """One sequence in the batch: its engine and its rules."""

    engine: Engine
    sampler: Sampler = greedy_sampler
    max_tokens: int = 256
    stop_ids: frozenset[int] | set[int] = frozenset()
    constraint: Constraint | None = None
    generated: list[int] = field(default_factory=list)
    finished: bool = False
    logits: mx.array | None = None  # (vocab,) after the last token fed
    error: Exception | None = None  # its grammar gave up: finished, and its caller is told

    @property
    def greedy(self) -> bool:
        return bool(getattr(self.sampler, "greedy", False))


def _check_joinable(row: Row) -> None:
    engine = row.engine
    if engine.logits is None:
        raise RuntimeError("nothing to continue from: prefill or sync a prompt first")
    if engine.cache_mode == "rotating" or not all(isinstance(c, KVCache) for c in engine.cache):
        raise CannotBatch("only preallocated or growing KV caches can join a batch")
    if row.max_tokens <= 0:
        raise ValueError(f"a row joins to generate at least one token, not {row.max_tokens}")
    if engine.room is not None and engine.room <= 0:
        raise ContextFull(f"{len(engine.tokens) + 1} tokens exceed the "
                          f"{engine.context_length}-token context")


class BatchDecoder:
    """The sequences decoding together over one model; see the module docstring."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.rows: list[Row] = []
        self.cache: list[BatchKVCache] | None = None
        self._full_mask: mx.array | None = None
        self._argmax: mx.array | None = None  # the next tokens, when queued with the forward

    def __len__(self) -> int:
        return len(self.rows)

    # -- joining and leaving -----------------------------------------------------------------

    def join(self, rows: Sequence[Row]) -> None:
        """Add sequences whose engines hold a prefilled prompt (and its logits)."""
        rows = list(rows)
        for row in rows:
            _check_joinable(row)
            if row.engine.room is not None:
                row.max_tokens = min(row.max_tokens, row.engine.room)
            row.logits = row.engine.logits
        if not rows:
            return
        self._argmax = None  # drawn for the rows before these joined
        layers = len(rows[0].engine.cache)
        new = [BatchKVCache.merge([r.engine.cache[i] for r in rows]) for i in range(layers)]
        if self.cache is None:
            self.cache = new
        else:
            for mine, theirs in zip(self.cache, new):
                mine.extend(theirs)
        self.rows += rows

    def leave(self, rows: Sequence[Row]) -> None:
        """Hand ``rows`` back to their engines: each engine's cache holds its tokens again,
        with the logits after the last one."""
        gone = {id(r) for r in rows}
        for i, row in enumerate(self.rows):
            if id(row) in gone:
                kvs = [(c.keys, c.values) for c in (layer.extract(i) for layer in self.cache)]
                _hand_back(row.engine, kvs, row.logits)
        keep = [i for i, r in enumerate(self.rows) if id(r) not in gone]
        if len(keep) == len(self.rows):
            return
        self._argmax = None  # drawn for the rows before these left
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache = None
        else:
            for layer in self.cache:
                layer.filter(mx.array(keep))

    # -- one token for every row -------------------------------------------------------------

    def step(self) -> list[int]:
        """Sample one token for every row, feed them all, hand the finished rows back to
        their engines; returns the tokens in the order of ``self.rows`` before the step."""
        rows = list(self.rows)
        if not rows:
            return []
        argmax_only = _argmax_only(rows)
        y, self._argmax = self._argmax, None
        if not argmax_only:  # no queued argmax, or a row's rules changed since it was queued
            y = None
        if y is None:
            y = self._sample(mx.stack([r.logits for r in rows]), rows)
            # y gets its own evaluation: an array read back waits for the whole graph it
            # was queued in, and the forward's graph would make reading y wait for it.
            mx.async_eval(y)
        logits = self.model(y[:, None], cache=self.cache)[:, -1, :]
        if argmax_only:
            # the next tokens need nothing from the rows' callers: queued with the forward
            # (an argmax draws nothing, so a row that stops has lost nothing), as mlx-lm's
            # BatchGenerator queues its sampling
            self._argmax = mx.argmax(logits, axis=-1)
            mx.async_eval(self._argmax)
        else:
            mx.async_eval(logits)  # the next forward runs while the rows handle their tokens
        tokens = y.tolist()
        for i, (row, token) in enumerate(zip(rows, tokens)):
            row.logits = logits[i]
            row.generated.append(token)
            row.engine.tokens.append(token)
            if row.constraint is not None and row.error is None:
                try:
                    row.constraint.consume(token)
                except GrammarError as e:  # this row's alone
                    row.error = e
            row.finished = (token in row.stop_ids or len(row.generated) >= row.max_tokens
                            or row.error is not None
                            or (row.constraint is not None and row.constraint.done))
        self.leave([r for r in rows if r.finished])
        return tokens

    def _sample(self, logits: mx.array, rows: list[Row]) -> mx.array:
        if any(r.constraint is not None for r in rows):
            logits = apply_bitmask(logits, self._masks(rows, logits.shape[-1]))
        picks = mx.argmax(logits, axis=-1)
        if all(r.greedy for r in rows):
            return picks
        parts = []
        for i, row in enumerate(rows):
            if row.greedy:
                parts.append(picks[i : i + 1])
            else:
                row_logits = logits[i]
                logprobs = row_logits - mx.logsumexp(row_logits, keepdims=True)
                parts.append(row.sampler(logprobs[None]).reshape(1).astype(picks.dtype))
        return mx.concatenate(parts)

    def _masks(self, rows: list[Row], vocab: int) -> mx.array:
        """Every row's allowed-token bitmask, stacked (all allowed where no grammar)."""
        masks = [self._mask(r) for r in rows]
        width = max([-(-vocab // 32)] + [m.shape[-1] for m in masks if m is not None])
        if self._full_mask is None or self._full_mask.shape[-1] != width:
            self._full_mask = mx.full((width,), -1, dtype=mx.int32)
        out = []
        for m in masks:
            if m is None:
                m = self._full_mask
            elif m.shape[-1] < width:  # tokens past a mask's last word are disallowed
                m = mx.pad(m, [(0, width - m.shape[-1])])
            out.append(m.astype(mx.int32))
        return mx.stack(out)

    @staticmethod
    def _mask(row: Row) -> mx.array | None:
        """A row's mask; None (all allowed) once its grammar gave up, which is the row's
        own error (the step ends it), not the batch's."""
        if row.constraint is None or row.error is not None:
            return None
        try:
            return row.constraint.mask()
        except GrammarError as e:
            row.error = e
            return None


def _argmax_only(rows: list[Row]) -> bool:
    """Every row's next token is its logits' argmax: greedy, no grammar."""
    return all(r.greedy and r.constraint is None for r in rows)


def _hand_back(engine: Engine, kvs: list[tuple[mx.array, mx.array]], logits) -> None:
    """Put a row's keys and values back into its engine's own cache (kept preallocated)."""
    tokens = list(engine.tokens)
    if kvs[0][0].shape[2] != len(tokens):
        raise AssertionError(f"a batch row holds {kvs[0][0].shape[2]} tokens, its engine "
                             f"{len(tokens)}")
    engine.restore(tokens, kvs, logits=logits)
