"""KV slots: snapshots of earlier conversations' KV state, so interleaved clients keep their
prefixes. The engine's live state is the most recent conversation; a request continues from
whichever (live state or snapshot) shares the longest token prefix with its prompt."""

from __future__ import annotations

from typing import Sequence

from ..engine import Engine, common_prefix, keep_snapshot


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
        keep_snapshot(self.engine, self.slots, self.size)
