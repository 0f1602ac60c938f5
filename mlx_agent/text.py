"""Text over the engine: stream the decoded text of a generation, O(1) work per token.

A :class:`TextStream` syncs the engine to the prompt ids (reusing the cached prefix), then
feeds each sampled id to mlx-lm's streaming detokenizer and yields the new text. The stop
token ends the stream and is not part of the text; it stays in the engine's cache, so the
turn is closed there. After iteration, :attr:`TextStream.result` holds the ids, the text,
why it stopped and the timings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Sequence

from .engine import Engine, PrefillStats, SamplingParams


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: list[int]  # every sampled id, the stop token included
    finish_reason: str  # "stop" (a stop token) or "length" (max tokens or context end)
    prefill: PrefillStats
    decode_seconds: float

    @property
    def decode_tps(self) -> float:
        return len(self.token_ids) / self.decode_seconds if self.decode_seconds else 0.0


class TextStream:
    def __init__(
        self,
        engine: Engine,
        tokenizer,
        prompt_ids: Sequence[int],
        *,
        sampling: SamplingParams = SamplingParams(),
        max_tokens: int = 256,
        stop_ids: frozenset[int] = frozenset(),
        constraint=None,
    ):
        self.engine, self.tokenizer = engine, tokenizer
        self.prompt_ids = list(prompt_ids)
        self.sampling, self.max_tokens, self.stop_ids = sampling, max_tokens, stop_ids
        self.constraint = constraint
        self.result: Completion | None = None

    def __iter__(self) -> Iterator[str]:
        prefill = self.engine.sync(self.prompt_ids)
        detok = self.tokenizer.detokenizer
        detok.reset()
        ids: list[int] = []
        finish = "length"
        start = time.perf_counter()
        for token in self.engine.generate(
            self.sampling.sampler(), max_tokens=self.max_tokens, stop_ids=self.stop_ids,
            constraint=self.constraint,
        ):
            ids.append(token)
            if token in self.stop_ids:
                finish = "stop"
                break
            detok.add_token(token)
            segment = detok.last_segment
            if segment:
                yield segment
        detok.finalize()
        tail = detok.last_segment
        if tail:
            yield tail
        self.result = Completion(detok.text, ids, finish, prefill, time.perf_counter() - start)
