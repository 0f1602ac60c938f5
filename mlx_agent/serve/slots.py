"""KV slots: snapshots of earlier conversations' KV state, so interleaved clients keep their
prefixes. The engine's live state is the most recent conversation; a request continues from
whichever (live state or snapshot) shares the longest token prefix with its prompt."""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx

from ..engine import Engine, common_prefix


class KVSlots:
    def __init__(self, engine: Engine, size: int, min_gain: int = 16):
        self.engine, self.size, self.min_gain = engine, size, min_gain
        self.slots: list[tuple[list[int], list]] = []

    def select(self, prompt: Sequence[int]) -> None:
        """Before the engine syncs to ``prompt``: keep the live state as a snapshot when
        ``prompt`` would overwrite ``min_gain`` or more of its tokens, and restore the
        snapshot that shares the most with ``prompt`` when it beats the live state."""
        if not self.size:
            return
        live = common_prefix(self.engine.tokens, prompt)
        best, gain = None, self.min_gain
        for i, (tokens, _) in enumerate(self.slots):
            n = common_prefix(tokens, prompt)
            if n - live >= gain:
                best, gain = i, n - live
        if len(self.engine.tokens) - live >= self.min_gain:
            self._stash()
        if best is not None:
            tokens, kvs = self.slots.pop(best)
            self.engine.restore(tokens, kvs)

    def _stash(self) -> None:
        try:
            tokens, kvs = self.engine.snapshot()
        except ValueError:  # empty, or a rotated window
            return
        # copies, so a snapshot does not keep the engine's whole preallocated buffer alive
        kvs = [(mx.contiguous(k), mx.contiguous(v)) for k, v in kvs]
        mx.eval(kvs)
        # a snapshot that is a prefix of this one is redundant
        self.slots = [s for s in self.slots if s[0] != tokens[: len(s[0])]]
        self.slots.append((tokens, kvs))
        del self.slots[: max(0, len(self.slots) - self.size)]
