"""What both HTTP APIs share: the client-error exception and request limits."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine import SamplingParams


class BadRequest(Exception):
    """A request the client must change; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400, code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


@dataclass(frozen=True)
class Limits:
    """Checks a request's length and sampling settings against the server's."""

    context_length: int
    default_sampling: SamplingParams
    vocab_size: int = 0  # the model's logits' width: a logit bias names ids below it

    def __call__(self, max_tokens: int | None, temperature: float | None, top_p: float | None,
                 seed: int | None, top_k: int | None = None, min_p: float | None = None,
                 max_tokens_name: str = "max_tokens", presence_penalty: float | None = None,
                 frequency_penalty: float | None = None,
                 logit_bias: dict[str, float] | None = None) -> tuple[int | None, SamplingParams]:
        """``max_tokens_name``: the field as the client sent it (Ollama's num_predict)."""
        ctx = self.context_length
        if max_tokens is not None and not 1 <= max_tokens <= ctx:
            raise BadRequest(f"{max_tokens_name} must be between 1 and the context length "
                             f"{ctx}, got {max_tokens}", param=max_tokens_name)
        if temperature is not None and not 0 <= temperature <= 2:
            raise BadRequest(f"temperature must be between 0 and 2, got {temperature}",
                             param="temperature")
        if top_p is not None and not 0 <= top_p <= 1:
            raise BadRequest(f"top_p must be between 0 and 1, got {top_p}", param="top_p")
        if top_p == 0:  # OpenAI takes it: only the most likely token, greedy
            temperature, top_p = 0.0, None
        for name, value in (("presence_penalty", presence_penalty),
                            ("frequency_penalty", frequency_penalty)):
            if value is not None and not -2 <= value <= 2:
                raise BadRequest(f"{name} must be between -2 and 2, got {value}", param=name)
        d = self.default_sampling
        if seed is not None:
            seed %= 2**64  # OpenAI takes any integer; MLX's generator a uint64
        try:
            sampling = SamplingParams(
                temperature=d.temperature if temperature is None else temperature,
                top_p=d.top_p if top_p is None else top_p,
                top_k=d.top_k if top_k is None else top_k,
                min_p=d.min_p if min_p is None else min_p,
                seed=d.seed if seed is None else seed,
                presence_penalty=presence_penalty or 0.0,
                frequency_penalty=frequency_penalty or 0.0,
                logit_bias=self._bias(logit_bias or {}))
        except ValueError as e:
            raise BadRequest(str(e)) from None
        return max_tokens, sampling

    def _bias(self, bias: dict[str, float]) -> tuple[tuple[int, float], ...]:
        """OpenAI's ``logit_bias`` (token ids as strings, each to -100..100), checked."""
        if len(bias) > 1024:  # OpenAI's cap: each is work on every token
            raise BadRequest(f"logit_bias has {len(bias)} entries; send at most 1024",
                             param="logit_bias")
        out = []
        for key, value in bias.items():
            if not key.isdecimal() or not key.isascii():
                shown = key if len(key) <= 40 else key[:40] + "..."  # a key may be megabytes
                raise BadRequest(f"logit_bias keys are token ids, got {shown!r}; write each id "
                                 "as a decimal number string", param="logit_bias")
            # past any vocabulary when that long (int() refuses over 4,300 digits)
            digits = key.lstrip("0") or "0"
            token = int(digits) if len(digits) <= 18 else None
            if token is None or self.vocab_size and token >= self.vocab_size:
                shown = token if token is not None else digits[:18] + "..."
                raise BadRequest(f"logit_bias names token {shown}, but the model's ids end "
                                 f"at {self.vocab_size - 1}", param="logit_bias")
            if not -100 <= value <= 100:
                raise BadRequest(f"logit_bias values are between -100 and 100, got {value} "
                                 f"for token {token}", param="logit_bias")
            out.append((token, float(value)))
        return tuple(out)
