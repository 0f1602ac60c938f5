"""The generation engine: token ids in, token ids out, over one KV cache.

An :class:`Engine` owns a model's cache and the ids whose keys and values it holds
(``engine.tokens``), plus the logits after the last of them, so generation continues without
re-feeding a token. It prefills in chunks, reuses the longest common prefix of a new prompt
(:meth:`Engine.sync`), and samples with mlx-lm's samplers, queuing step n+1 with
``mx.async_eval`` before handing back step n, as ``mlx_lm.generate_step`` does.

Invariant: every token :meth:`Engine.generate` yields has been fed to the model, so
``engine.tokens`` is always exactly the sequence in the cache (a turn's closing
``<|im_end|>`` included).

It knows nothing of text, chat turns or tools. It is not thread-safe: one engine, one caller.
A grammar reaches it only as a :class:`Constraint` (see :mod:`mlx_agent.grammar`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, Sequence, TypeVar

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from .cache import CacheMode, ContextFull, KVSpec, make_cache, set_pinned, trimmable
from .kernels import apply_bitmask

T = TypeVar("T")

Sampler = Callable[[mx.array], mx.array]

# Models whose logits are exactly head(model.model(x)); for them prefill applies the
# output head to the last position only instead of to every prompt position.
_HEAD_ON_LAST_ONLY = frozenset({"llama", "mistral", "qwen2", "qwen3", "tinygpt"})


# Tokens per prefill chunk, on Metal and on the CPU. On the float CPU kernels a chunk
# dequantizes every layer's weights once, so larger chunks cost less per token: on
# SmolLM2-135M's Q4_1 weights a 512-token prompt prefilled at 405 tok/s in 512-token chunks
# against 300 in 128-token ones (2,048 tokens: 320 against 269); on float32 weights 371
# against 359. The VNNI kernel multiplies chunks without dequantizing: there 128-token chunks
# measured about as fast as 512-token ones (scripts/bench_prefill_step.py, README).
PREFILL_STEP = 512


def output_head(model: nn.Module) -> Callable[[mx.array], mx.array] | None:
    """The model's hidden-state -> logits map, where it is known to be the whole story:
    ``model(x) == head(model.model(x))``, so the head can run on the positions that need
    logits only (the last one when decoding, the scored ones when training)."""
    if getattr(model, "model_type", None) not in _HEAD_ON_LAST_ONLY:
        return None
    if hasattr(model, "output_head"):
        return model.output_head
    if getattr(model.args, "tie_word_embeddings", False):
        return model.model.embed_tokens.as_linear
    return model.lm_head


class Constraint(Protocol):
    """What the engine asks of a grammar: a mask before each token, the token after it."""

    def mask(self) -> mx.array:
        """The allowed-token bitmask for the next token (llguidance's int32 layout)."""

    def consume(self, token: int) -> None: ...

    @property
    def done(self) -> bool:
        """No more tokens: the grammar reached its end."""


def greedy_sampler(logprobs: mx.array) -> mx.array:
    return mx.argmax(logprobs, axis=-1)


greedy_sampler.greedy = True


def _categorical(temperature: float, filters: list[Callable], seed: int | None) -> Sampler:
    """mlx-lm's filter chain and categorical draw; with a seed, from a key of its own, so
    MLX's global generator is neither used nor reseeded."""
    key = mx.random.key(seed) if seed is not None else None

    def sample(logprobs: mx.array) -> mx.array:
        nonlocal key
        for f in filters:
            logprobs = f(logprobs)
        if key is None:
            return mx.random.categorical(logprobs * (1 / temperature))
        key, draw = mx.random.split(key)
        return mx.random.categorical(logprobs * (1 / temperature), key=draw)

    return sample


def _adjusted(inner: Sampler, presence: float, frequency: float,
              bias: tuple[tuple[int, float], ...]) -> Sampler:
    """``inner`` drawing from logprobs moved as OpenAI's penalties and ``logit_bias`` move
    logits: ``bias[t]`` added, ``frequency`` times the count of ``t`` among the tokens this
    sampler has drawn subtracted, and ``presence`` once ``t`` has been drawn at all (the
    generated tokens only, not the prompt's, as OpenAI and vLLM count them); renormalised
    before ``inner``'s filters. The counts are a lazy array, so a draw waits on nothing.
    Not mlx-lm's ``make_logits_processors``: its penalties count the last 20 tokens, the
    prompt's included, and take the token history our samplers are not given."""
    counts: mx.array | None = None
    added: mx.array | None = None  # the bias over the vocabulary

    def sample(logprobs: mx.array) -> mx.array:
        nonlocal counts, added
        if counts is None:
            counts = mx.zeros((logprobs.shape[-1],), dtype=mx.float32)
            kept = [(i, b) for i, b in bias if i < logprobs.shape[-1]]
            if kept:
                ids, values = zip(*kept)
                added = counts.at[mx.array(ids)].add(mx.array(values, dtype=mx.float32))
        x = logprobs if added is None else logprobs + added
        if presence or frequency:
            x = x - (frequency * counts + presence * (counts > 0))
        token = inner(x - mx.logsumexp(x, axis=-1, keepdims=True))
        if presence or frequency:  # a bias alone reads no counts: no chain of updates
            counts = counts.at[token.reshape(-1)].add(1.0)
        return token

    return sample


# Below this a temperature or top-p is greedy. Logprobs are float32, scaled by 1 / temperature:
# at 1e-39 the scale is past float32's range (1e-300 too), every logprob -inf and the draw
# random; a top-p that small rounds to 0 in float32 and drops every token. Either way what is
# asked for is the most likely token (any top-p under 1 / vocabulary size keeps only it), and
# 1e-30 leaves both far inside float32's range.
MIN_SAMPLED = 1e-30


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings; ``temperature == 0`` is greedy (argmax), and so is a temperature
    or top-p below :data:`MIN_SAMPLED` (the most likely token, where float32 cannot say)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0  # OpenAI's, -2..2: subtracted from a token drawn before
    frequency_penalty: float = 0.0  # -2..2: times the number of times it was drawn
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, -100..100) added to its logit

    def __post_init__(self):
        if not self.temperature >= 0 or math.isinf(self.temperature):  # NaN fails >= too
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top-k must be >= 0, got {self.top_k}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min-p must be in [0, 1), got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:  # NaN fails too
                raise ValueError(f"{name.replace('_', ' ')} must be between -2 and 2, "
                                 f"got {getattr(self, name)}")
        for token, value in self.logit_bias:
            if token < 0 or not -100 <= value <= 100:
                raise ValueError(f"a logit bias maps a token id (>= 0) to a number between "
                                 f"-100 and 100, got {token}: {value}")
        if self.seed is not None:  # any integer: MLX's keys take 64 bits, as requests' do
            object.__setattr__(self, "seed", self.seed % 2**64)

    def sampler(self) -> Sampler:
        """A new sampler for these settings (mlx-lm's filters, in ``make_sampler``'s order).

        With a seed it draws from a key of its own: the same seed and the same logits give
        the same tokens, and nothing else's randomness changes (a prompt prefilled in other
        chunks, or partly reused from a cache, has logits that differ by float rounding, so a
        draw near a tie may differ). A greedy sampler is marked ``greedy`` so the
        engine can skip the log-softmax. Penalties and a logit bias make a sampler that
        counts its own draws: one generation's, not to be shared.
        """
        adjust = self.presence_penalty or self.frequency_penalty or self.logit_bias
        if self.temperature < MIN_SAMPLED or self.top_p < MIN_SAMPLED:
            if adjust:
                return _adjusted(greedy_sampler, self.presence_penalty,
                                 self.frequency_penalty, self.logit_bias)
            return greedy_sampler
        filters = []
        if 0 < self.top_p < 1:
            filters.append(lambda x: apply_top_p(x, self.top_p))
        if self.min_p:
            filters.append(lambda x: apply_min_p(x, self.min_p))
        if self.top_k > 0:  # k at or past the vocabulary keeps every token (mlx-lm raises,
            # inside a compiled function whose random state it then leaves broken)
            filters.append(lambda x: x if self.top_k >= x.shape[-1] else apply_top_k(x, self.top_k))
        sample = _categorical(self.temperature, filters, self.seed)
        if adjust:
            return _adjusted(sample, self.presence_penalty, self.frequency_penalty,
                             self.logit_bias)
        return sample


class PrefillStopped(Exception):
    """A prefill its caller's ``stop`` ended early; the engine holds what it held before."""


@dataclass(frozen=True)
class PrefillStats:
    reused: int  # prompt tokens whose KV state was already in the cache
    prefilled: int  # prompt tokens run through the model now
    seconds: float


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def keep_snapshot(engine: "Engine", store: list, size: int) -> None:
    """Append ``engine``'s state to ``store`` as ``(tokens, kvs)``, the newest last, at most
    ``size`` kept; entries whose tokens are a prefix of the new one are redundant and go.
    The KV arrays are evaluated copies, so a snapshot does not keep the engine's whole
    preallocated buffer alive. An empty engine, or a rotated window, adds nothing."""
    try:
        tokens, kvs = engine.snapshot()
    except ValueError:
        return
    kvs = [(mx.contiguous(k), mx.contiguous(v)) for k, v in kvs]
    mx.eval(kvs)
    store[:] = [e for e in store if e[0] != tokens[: len(e[0])]]
    store.append((tokens, kvs))
    del store[: max(0, len(store) - size)]


class Engine:
    def __init__(
        self,
        model: nn.Module,
        *,
        context_length: int,
        cache_mode: CacheMode = "preallocated",
        kv_window: int | None = None,
        prefill_step: int | None = None,
        kv_spec: KVSpec | None = None,
    ):
        if context_length <= 0:
            raise ValueError(f"context length must be positive, got {context_length}")
        prefill_step = prefill_step or PREFILL_STEP
        if prefill_step <= 0:
            raise ValueError(f"prefill step must be positive, got {prefill_step}")
        self.model = model
        self.context_length = context_length
        self.cache_mode = cache_mode
        self.kv_window = kv_window or context_length
        self.prefill_step = prefill_step
        self.kv_spec = kv_spec
        self._head = output_head(model)
        self.reset()

    # -- state -------------------------------------------------------------------------

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the thread that does this engine's MLX work: this one (a batched
        engine runs it on its runner's model thread)."""
        return fn()

    def reset(self, keep: int = 0) -> None:
        """Empty the cache; in rotating mode pin the first ``keep`` tokens."""
        size = self.kv_window if self.cache_mode == "rotating" else self.context_length
        self.cache = make_cache(self.model, self.cache_mode, size, keep=keep, kv_spec=self.kv_spec)
        self.tokens: list[int] = []
        self._logits: mx.array | None = None

    def pin(self, keep: int) -> None:
        """Pin the first ``keep`` tokens (the system prompt) in rotating mode."""
        set_pinned(self.cache, keep)

    @property
    def room(self) -> int | None:
        """Tokens that still fit, or None when the window rotates forever."""
        if self.cache_mode == "rotating":
            return None
        return self.context_length - len(self.tokens)

    @property
    def logits(self) -> mx.array | None:
        """Logits (vocab,) after the last token in the cache."""
        return self._logits

    def computes_whole(self, n: int) -> bool:
        """Whether this engine computes each of ``n`` tokens seeing every one before it: not
        a rotating window shorter than ``n`` (its later tokens see only the window), which
        therefore must not load a state of ``n`` tokens saved elsewhere, nor save its own."""
        return self.cache_mode != "rotating" or n <= self.kv_window

    def snapshot(self) -> tuple[list[int], list[tuple[mx.array, mx.array]]]:
        """The cached ids and, per layer, their keys and values in order, ``[1, H, T, D]``.

        Raises ValueError once a rotating window holds more tokens than it spans (then the
        cache no longer holds a prefix of ``tokens``, or not as full attention computes it).
        """
        n = len(self.tokens)
        if not self.computes_whole(n):
            # a chunk longer than the window is held whole until the next step, but its
            # later tokens were computed seeing only the window: not a prefix's KV state
            raise ValueError("the KV cache holds more tokens than its window, some computed "
                             "through the window")
        kvs = []
        for c in self.cache:
            if getattr(c, "offset", None) != n or (c.keys is not None and c.keys.shape[2] < n):
                raise ValueError("the KV cache no longer holds every token (the window rotated)")
            if n == 0:
                raise ValueError("nothing to snapshot: the cache is empty")
            kvs.append((c.keys[..., :n, :], c.values[..., :n, :]))
        return list(self.tokens), kvs

    def restore(self, tokens: Sequence[int], kvs: Sequence[tuple[mx.array, mx.array]],
                logits: mx.array | None = None) -> None:
        """Replace the cache with a snapshot: ``tokens`` and their keys and values (and the
        ``logits`` after the last token, when known)."""
        if len(kvs) != len(self.model.layers):
            raise ValueError(f"snapshot has {len(kvs)} layers, the model {len(self.model.layers)}")
        if self.room is not None and len(tokens) > self.context_length:
            raise ContextFull(f"a {len(tokens)}-token snapshot exceeds the "
                              f"{self.context_length}-token context")
        self._truncate(0)
        for c, (k, v) in zip(self.cache, kvs):
            c.update_and_fetch(k, v)
        mx.eval([c.state for c in self.cache])
        self.tokens = list(tokens)
        self._logits = logits

    # -- feeding -----------------------------------------------------------------------

    def _forward(self, ids: mx.array, want_logits: bool) -> mx.array | None:
        x = ids[None]
        if not want_logits:
            (self.model.model if self._head else self.model)(x, cache=self.cache)
            return None
        if self._head:
            logits = self._head(self.model.model(x, cache=self.cache)[:, -1:, :])
        else:
            logits = self.model(x, cache=self.cache)[:, -1:, :]
        return logits[0, -1]

    def _check_room(self, n: int) -> None:
        room = self.room
        if room is not None and n > room:
            raise ContextFull(
                f"{len(self.tokens) + n} tokens exceed the {self.context_length}-token context",
                "raise --context-length, or use a rotating --kv-window")

    def prefill(self, ids: Sequence[int], stop: Callable[[], bool] | None = None) -> PrefillStats:
        """Append ``ids`` to the cache in chunks; keep the logits after the last one.

        ``stop`` is asked before every chunk after the first: when it says so (a client
        that left), the chunks fed are dropped again and :class:`PrefillStopped` raised, so
        the engine holds what it held before."""
        ids = list(ids)
        start = time.perf_counter()
        if not ids:
            return PrefillStats(len(self.tokens), 0, 0.0)
        self._check_room(len(ids))
        arr = mx.array(ids, dtype=mx.uint32)
        starts = range(0, len(ids), self.prefill_step)
        try:
            for start_at in starts:
                if start_at and stop is not None and stop():
                    held = len(self.tokens)
                    if self._truncate(held) < held:  # emptied: the old logits are stale
                        self._logits = None
                    raise PrefillStopped(f"stopped after {start_at} of {len(ids)} tokens")
                chunk = arr[start_at : start_at + self.prefill_step]
                if start_at == starts[-1]:  # the last chunk also yields the next logits
                    self._logits = self._forward(chunk, want_logits=True)
                    mx.eval(self._logits)
                else:
                    self._forward(chunk, want_logits=False)
                    mx.eval([c.state for c in self.cache])
                    mx.clear_cache()
        except KeyboardInterrupt:
            self._repair()
            raise
        self.tokens.extend(ids)
        return PrefillStats(0, len(ids), time.perf_counter() - start)

    def logprob(self, ids: Sequence[int]) -> float:
        """The log-probability the model gives ``ids`` after what the cache holds, with no
        sampler or grammar: each id's log-softmax where it stands, summed. The cache then
        holds all but the last id (whose own logits are never needed)."""
        if self._logits is None:
            raise RuntimeError("nothing to continue from: prefill or sync a prompt first")
        total = 0.0
        for i, token in enumerate(ids):
            if i:
                self.prefill([ids[i - 1]])
            logits = self._logits.astype(mx.float32)
            total += (logits[token] - mx.logsumexp(logits)).item()
        return total

    def sync(self, ids: Sequence[int], stop: Callable[[], bool] | None = None) -> PrefillStats:
        """Make the cache hold exactly ``ids``, reusing the longest common prefix.

        Tokens after the common prefix are trimmed and only the new suffix is prefilled.
        At least the last token is re-fed when nothing new follows the prefix, so that
        logits for the next position exist. ``stop`` as for :meth:`prefill`: a stopped
        sync leaves the common prefix (and no logits, if it trimmed anything).
        """
        ids = list(ids)
        if not ids:
            raise ValueError("cannot sync to an empty prompt")
        start = time.perf_counter()
        common = common_prefix(self.tokens, ids)
        if common == len(ids) == len(self.tokens) and self._logits is not None:
            return PrefillStats(common, 0, 0.0)
        common = min(common, len(ids) - 1)
        if common < len(self.tokens):
            common = self._truncate(common)
            self._logits = None  # they followed a token no longer held (a stopped prefill
            # would otherwise leave them in place for the next sync to reuse)
        stats = self.prefill(ids[common:], stop)
        return PrefillStats(common, stats.prefilled, time.perf_counter() - start)

    def _repair(self) -> None:
        """After an interruption mid-step (Ctrl-C): make every layer's cache hold exactly
        ``self.tokens`` again (a forward pass may have reached only some layers), and
        recompute the logits after the last token."""
        tokens = list(self.tokens)
        keep = self._truncate(max(len(tokens) - 1, 0))  # the last token is re-fed for logits
        self._logits = None
        if tokens[keep:]:
            self.prefill(tokens[keep:])

    def _truncate(self, keep: int) -> int:
        """Make the cache hold only the first ``keep`` tokens: trimmed where every layer's
        cache can be (preallocated buffers are kept), else emptied. Returns what it holds."""
        if trimmable(self.cache) and all(c.offset >= keep for c in self.cache):
            for c in self.cache:
                c.trim(c.offset - keep)
        else:
            self.reset(keep=self.pinned)
            keep = 0
        del self.tokens[keep:]
        return keep

    @property
    def pinned(self) -> int:
        """Tokens pinned at the start of a rotating window (0 in other modes)."""
        return next((c.keep for c in self.cache if hasattr(c, "keep")), 0)

    # -- decoding ----------------------------------------------------------------------

    def generate(
        self,
        sampler: Sampler | None = None,
        *,
        max_tokens: int = 256,
        stop_ids: frozenset[int] | set[int] = frozenset(),
        constraint: Constraint | None = None,
    ) -> Iterator[int]:
        """Sample up to ``max_tokens`` ids, stopping after the first id in ``stop_ids``.

        Each yielded id is already fed to the model (see the module docstring); the sampler
        is called once per yielded id. A ``constraint`` (see :mod:`mlx_agent.grammar`) masks
        the logits before each draw and ends generation when its grammar is done; its mask
        for token n+1 is computed on the CPU while the model computes the logits for it.
        """
        if self._logits is None:
            raise RuntimeError("nothing to continue from: prefill or sync a prompt first")
        sampler = sampler or greedy_sampler
        room = self.room
        if room is not None:
            if room <= 0:
                self._check_room(1)
            max_tokens = min(max_tokens, room)
        greedy = getattr(sampler, "greedy", False)

        def sample(logits: mx.array) -> mx.array:
            if constraint is not None:
                logits = apply_bitmask(logits, constraint.mask())
            if greedy:  # argmax needs no normalisation
                return mx.argmax(logits, axis=-1, keepdims=True)
            logprobs = logits - mx.logsumexp(logits, keepdims=True)
            return sampler(logprobs[None])

        try:
            yield from self._decode(sample, max_tokens, stop_ids, constraint)
        except KeyboardInterrupt:
            self._repair()
            raise

    def _decode(self, sample, max_tokens: int, stop_ids, constraint) -> Iterator[int]:
        y = sample(self._logits)
        mx.async_eval(y)
        for n in range(max_tokens):
            # Queue the forward pass of y before waiting for y's value, so the model
            # computes step n+1 while the caller (and the grammar) handle token n.
            next_logits = self._forward(y, want_logits=True)
            mx.async_eval(next_logits)
            token = y.item()
            self.tokens.append(token)
            self._logits = next_logits
            if constraint is not None:
                constraint.consume(token)
            yield token
            if token in stop_ids or (constraint is not None and constraint.done) \
                    or n + 1 == max_tokens:  # no draw for a token that will not be asked for
                return
            if n % 256 == 255:
                mx.clear_cache()
            # Sampled only once the caller asks for more: exactly one draw per token
            # handed out, so a caller that stops early leaves the sampler untouched.
            y = sample(next_logits)
            mx.async_eval(y)
