"""The one text layer over the engine: a generation as (token id, text segment) pairs.

A :class:`TextStream` continues from whatever the engine holds (sync a prompt first), feeds
each sampled id to mlx-lm's streaming detokenizer (O(1) work per token) and yields the id
with the text it completes, which may be empty. A stop id ends the stream; it yields with no
text and stays in the engine's cache, so the turn is closed there. Whether the caller reads
to the end or stops early, :meth:`TextStream.flush` gives the text the detokenizer still
holds, once. The agent loop, the server and ``generate`` all read generations this way.
"""

from __future__ import annotations

import time
from typing import Iterator

from .engine import Constraint, Engine, Sampler


class TextStream:
    def __init__(self, engine: Engine, tokenizer, sampler: Sampler | None = None, *,
                 max_tokens: int = 256, stop_ids: frozenset[int] = frozenset(),
                 constraint: Constraint | None = None, continuation: bool = False):
        """``continuation``: the generation continues the prompt's text (a completion, not
        a reply that starts a message), so its first token keeps its leading space."""
        self.engine, self.sampler = engine, sampler
        self.max_tokens, self.stop_ids, self.constraint = max_tokens, stop_ids, constraint
        self.detok = tokenizer.detokenizer  # a copy of its own
        if continuation:
            keep_first_space(self.detok)
        self.ids: list[int] = []  # every sampled id, a stop id included
        self.decode_seconds = 0.0
        self._flushed = False

    def __iter__(self) -> Iterator[tuple[int, str]]:
        self.detok.reset()
        start = time.perf_counter()
        try:
            for token in self.engine.generate(self.sampler, max_tokens=self.max_tokens,
                                              stop_ids=self.stop_ids, constraint=self.constraint):
                self.ids.append(token)
                if token in self.stop_ids:
                    yield token, ""
                    return
                self.detok.add_token(token)
                yield token, self.detok.last_segment  # reading it consumes it
        finally:
            self.decode_seconds = time.perf_counter() - start

    def flush(self) -> str:
        """The text the detokenizer held back (a partial character at the end); once."""
        if self._flushed:
            return ""
        self._flushed = True
        self.detok.finalize()
        return self.detok.last_segment

    @property
    def text(self) -> str:
        return self.detok.text

    @property
    def finish_reason(self) -> str:
        """``stop`` (a stop id, or the grammar's end) or ``length``."""
        if self.ids and self.ids[-1] in self.stop_ids:
            return "stop"
        if self.constraint is not None and self.constraint.done:
            return "stop"
        return "length"

    @property
    def decode_tps(self) -> float:
        return len(self.ids) / self.decode_seconds if self.decode_seconds else 0.0


def keep_first_space(detok) -> None:
    """mlx-lm's streaming detokenizers drop the first token's leading space, right for a
    reply (``" Paris"`` after ``assistant\\n`` is ``"Paris"``) and wrong for a completion
    (``"The capital of France is" + " Paris"``). This one keeps it where mlx-lm's own
    detokenizers drop it: SentencePiece's has a switch, the byte-level BPE one a method to
    replace. The naive one decodes with the tokenizer, which decides for itself."""
    if hasattr(detok, "trim_space"):
        detok.trim_space = False
    if hasattr(detok, "_maybe_trim_space"):
        detok._maybe_trim_space = lambda text: text
