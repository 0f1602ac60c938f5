"""KV slots and lanes: where the chat service's requests decode, and what they reuse.

:class:`KVSlots` keeps snapshots of earlier conversations' KV state, so interleaved clients
keep their prefixes: an engine's live state is its most recent conversation, and a request
continues from whichever (live state or snapshot) shares the longest token prefix with its
prompt. :class:`Lanes` are the engines requests run on: one for a server that serves one
request at a time, or several batched engines of one runner (``serve --max-batch``), whose
slots share one store, so a conversation's snapshot serves it on any lane. A request takes
the free lane whose live state shares the most with its prompt.

Not promised: that a conversation returns to the lane it last used (a busy lane is not
waited for), or lanes of plain engines used from several threads (MLX work of one model
must run on one thread: give batched engines).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Sequence

from ..engine import Engine, common_prefix, keep_snapshot


class KVSlots:
    def __init__(self, engine: Engine, size: int, min_gain: int = 16,
                 shared: "KVSlots | None" = None):
        self.engine, self.size, self.min_gain = engine, size, min_gain
        self.slots: list[tuple[list[int], list]] = shared.slots if shared else []
        self._lock = shared._lock if shared else threading.Lock()

    def select(self, prompt: Sequence[int]) -> None:
        """Before the engine syncs to ``prompt``: keep the live state as a snapshot when
        ``prompt`` would overwrite ``min_gain`` or more of its tokens, and restore the
        snapshot that shares the most with ``prompt`` when it beats the live state."""
        if self.size:
            with self._lock:
                self.engine.call(lambda: self._select(prompt))

    def _select(self, prompt: Sequence[int]) -> None:
        live = common_prefix(self.engine.tokens, prompt)
        best, gain = None, self.min_gain
        for i, (tokens, _) in enumerate(self.slots):
            n = common_prefix(tokens, prompt)
            if n - live >= gain:
                best, gain = i, n - live
        # taken out before the live state is kept: keeping it may drop the oldest slot and
        # move the others' indices (the wrong state came back once the store was full)
        chosen = self.slots.pop(best) if best is not None else None
        if len(self.engine.tokens) - live >= self.min_gain:
            keep_snapshot(self.engine, self.slots, self.size)
        if chosen is not None:
            self.engine.restore(*chosen)


class Lanes:
    """The engines a service decodes on, each with KV slots over one shared store."""

    def __init__(self, engines: Sequence[Engine], kv_slots: int):
        if not engines:
            raise ValueError("a service needs at least one engine")
        first = KVSlots(engines[0], kv_slots)
        self.engines = list(engines)
        self._free = [(engines[0], first)] + [(e, KVSlots(e, kv_slots, shared=first))
                                              for e in engines[1:]]
        self._cv = threading.Condition()

    def __len__(self) -> int:
        return len(self.engines)

    @contextlib.contextmanager
    def lease(self, prompt: Sequence[int]) -> Iterator[tuple[Engine, KVSlots]]:
        """The free lane that shares the most with ``prompt`` (waiting for one), held
        until the block ends."""
        with self._cv:
            self._cv.wait_for(lambda: self._free)
            lane = max(self._free, key=lambda lane: common_prefix(lane[0].tokens, prompt))
            self._free.remove(lane)
        try:
            yield lane
        finally:
            with self._cv:
                self._free.append(lane)
                self._cv.notify()
