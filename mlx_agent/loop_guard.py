"""The loop guard: a constraint that keeps a model from repeating a tool call it already made.

Within one user turn, every call that ran is written the way the grammar writes it
(:func:`mlx_agent.grammar.call_text`: the grammar's separators and key order, hermes tags),
as the bytes of the tokens the model would sample for it (:func:`call_bytes`). A
:class:`LoopGuard` wraps the reply's grammar constraint and, before each token, masks every
token that would complete one of those texts, or after which the grammar leaves no way but
to complete it (a look-ahead along the call's remaining bytes, through the grammar itself),
so the model must make a different call or answer while it still can. Matching is on bytes
and incremental: a KMP automaton per repeated call follows the reply; the tokens on a call's
path are found by bisection and exact look-up in the vocabulary sorted by bytes, so a step
costs a few look-ups and grammar masks, not a pass over the vocabulary. Should every token
the grammar allows be masked, the guard stands aside for that token rather than leave none.

Not promised: a call written with other string escapes than Python's ``json`` writes (the
grammar also allows ``\\u00e9`` for ``é``), or one that starts in the middle of a token, is
not recognised as the same call.
"""

from __future__ import annotations

import bisect
import functools
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from .engine import Constraint
from .grammar import call_text
from .tools import Tool


MAX_SPACED = 4  # every combination of spaced strings up to this many forms (two strings)


def spaced_forms(arguments: Any) -> list[Any]:
    """The arguments a model may write that :func:`~mlx_agent.formats.unspaced` reads as ``arguments``, for the
    guard (which refuses a call by the text the grammar writes): each string that
    starts with a character other than a space, with and without one in front. Every
    combination while there are at most :data:`MAX_SPACED` of them; beyond, as given, each
    string spaced alone, and all spaced (a model copies one value with its space, or all
    of them). Each form costs the guard time a token (``scripts/bench_loop_guard.py``: for
    a call of four strings, 1.0-1.3 ms a token with these 6 forms, 1.6-2.2 with all 16
    combinations, 0.6-0.7 with one, the grammar's own mask 0.3-0.5), hence the bound."""
    paths: list[tuple] = []

    def find(v: Any, path: tuple) -> None:
        if isinstance(v, str) and v[:1].strip():
            paths.append(path)
        elif isinstance(v, dict):
            for k, x in v.items():
                find(x, path + (k,))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                find(x, path + (i,))

    def spaced(chosen: set) -> Any:
        def walk(v: Any, path: tuple) -> Any:
            if isinstance(v, dict):
                return {k: walk(x, path + (k,)) for k, x in v.items()}
            if isinstance(v, list):
                return [walk(x, path + (i,)) for i, x in enumerate(v)]
            return " " + v if path in chosen else v
        return walk(arguments, ())

    find(arguments, ())
    if 2 ** len(paths) <= MAX_SPACED:
        choices = [{p for i, p in enumerate(paths) if mask >> i & 1}
                   for mask in range(2 ** len(paths))]
    else:
        choices = [set(), *({p} for p in paths), set(paths)]
    return [spaced(c) for c in choices]


def refused_texts(protocol: str, tool: Tool, arguments: Any) -> list[str]:
    """The texts the guard refuses once ``tool`` ran with ``arguments``: the call as the
    grammar writes it, in each form a model may write it (:func:`spaced_forms`)."""
    return [call_text(protocol, tool, form) for form in spaced_forms(arguments)]


class TokenBytes:
    """Every token's bytes, sorted, to find the tokens that start with given bytes."""

    def __init__(self, ll_tokenizer, vocab_size: int):
        pieces = sorted((ll_tokenizer.decode_bytes([i]), i)
                        for i in range(min(vocab_size, ll_tokenizer.vocab_size)))
        self.keys = [p for p, _ in pieces]
        self.ids = [i for _, i in pieces]
        self.max_len = max(map(len, self.keys), default=0)
        self.exact: dict[bytes, list[int]] = {}
        for piece, i in pieces:
            self.exact.setdefault(piece, []).append(i)

    def prefixes_of(self, text: bytes) -> list[tuple[int, int]]:
        """(id, length) of the tokens whose bytes are a proper, non-empty prefix of text."""
        return [(i, n) for n in range(1, min(len(text), self.max_len + 1))
                for i in self.exact.get(text[:n], ())]

    def starting_with(self, prefix: bytes) -> list[int]:
        lo = bisect.bisect_left(self.keys, prefix)
        hi = lo
        while hi < len(self.keys) and self.keys[hi].startswith(prefix):
            hi += 1
        return self.ids[lo:hi]


@functools.lru_cache(maxsize=4)
def token_bytes(ll_tokenizer, vocab_size: int) -> TokenBytes:
    return TokenBytes(ll_tokenizer, vocab_size)


def call_bytes(lm, ll_tokenizer, text: str) -> bytes:
    """``text`` as the bytes the guard sees when the model writes it (special tokens, such
    as a ``<tool_call>`` tag in some vocabularies, as llguidance spells them)."""
    return b"".join(ll_tokenizer.decode_bytes([t]) for t in lm.encode(text))


class _Matcher:
    """KMP over one call's bytes: how much of it the reply's text ends with."""

    def __init__(self, text: bytes):
        self.text = text
        self.fail = [0] * len(text)
        k = 0
        for i in range(1, len(text)):
            while k and text[i] != text[k]:
                k = self.fail[k - 1]
            if text[i] == text[k]:
                k += 1
            self.fail[i] = k
        self.matched = 0

    def feed(self, data: bytes) -> None:
        text, k = self.text, self.matched
        for b in data:
            while k and text[k] != b:
                k = self.fail[k - 1]
            if text[k] == b:
                k += 1
            if k == len(text):  # the whole call went through (it began mid-token)
                k = self.fail[k - 1]
        self.matched = k

    def remainders(self):
        """Every way the call could still end from here: its rest after each match."""
        k = self.matched
        while True:
            yield self.text[k:]
            if k == 0:
                return
            k = self.fail[k - 1]


def _allowed(words: np.ndarray, t: int) -> bool:
    return bool(words[t >> 5] & np.uint32(1 << (t & 31)))


def _count(words: np.ndarray) -> int:
    return int(np.unpackbits(words.view(np.uint8)).sum())


class LoopGuard:
    """``inner``'s constraint, minus the tokens that would complete one of ``calls``."""

    def __init__(self, inner: Constraint, tokens: TokenBytes, calls: Sequence[bytes],
                 ll_tokenizer):
        self.inner, self.tokens, self.ll = inner, tokens, ll_tokenizer
        self.calls = list(calls)
        self.matchers = [_Matcher(c) for c in self.calls]
        self.interventions = 0  # steps where a token the grammar allowed was masked

    def reset(self) -> None:
        self.inner.reset()
        self.matchers = [_Matcher(c) for c in self.calls]

    def mask(self) -> mx.array:
        words = self.inner.mask_words().view(np.uint32)
        rests = {rest for m in self.matchers for rest in m.remainders()}
        doomed = self._doomed(frozenset(rests), words, {})
        if doomed and len(doomed) < _count(words):  # never leave no token at all
            for t in doomed:
                words[t >> 5] &= ~np.uint32(1 << (t & 31))
            self.interventions += 1
        return mx.array(words.view(np.int32))

    def _doomed(self, rests: frozenset, words: np.ndarray, memo: dict) -> set[int]:
        """The allowed tokens after which some call in ``rests`` (what is left of each
        repeated call from here) is certain: they write one whole, or they write the start
        of one or more and the grammar leaves no way but to finish one of them."""
        doomed, paths = set(), {}
        for rest in rests:
            if len(rest) <= self.tokens.max_len:
                doomed.update(t for t in self.tokens.starting_with(rest) if _allowed(words, t))
            for t, n in self.tokens.prefixes_of(rest):
                if _allowed(words, t):
                    paths.setdefault(t, set()).add(rest[n:])
        matcher = self.inner.matcher
        for t, ahead in paths.items():
            if t in doomed:
                continue
            matcher.consume_token(t)
            escapes = self._escapes(frozenset(ahead), memo)
            matcher.rollback(1)
            if not escapes:
                doomed.add(t)
        return doomed

    def _escapes(self, rests: frozenset, memo: dict) -> bool:
        """Whether, from the grammar's current state, the model can still avoid writing
        every one of ``rests``.

        The bytes the grammar forces next settle most states at once: forced bytes that
        cover a rest make it certain; forced bytes that leave a rest drop it; none forced
        means two next bytes are possible (or the end), so if every rest starts with the
        same byte, one way leaves them all. Otherwise look one token ahead, through the
        grammar's mask, and recurse along the tokens that stay on some call's path."""
        if rests not in memo:
            forced = bytes(self.inner.matcher.compute_ff_bytes())
            if any(forced.startswith(r) for r in rests if forced):
                memo[rests] = False
                return False
            left = frozenset(r for r in rests if r.startswith(forced[:len(r)]))
            if not left or not forced and len({r[:1] for r in left}) == 1:
                memo[rests] = True
                return True
            words = np.empty(self.inner.words, dtype=np.uint32)
            self.inner.matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
            memo[rests] = len(self._doomed(left, words, memo)) < _count(words)
        return memo[rests]

    def consume(self, token: int) -> None:
        self.inner.consume(token)
        data = self.ll.decode_bytes([token])
        for m in self.matchers:
            m.feed(data)

    @property
    def done(self) -> bool:
        return self.inner.done
