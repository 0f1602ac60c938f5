"""KV caches: three modes behind mlx-lm's cache protocol.

- ``preallocated`` (default): one buffer per layer, allocated in steps of
  :data:`PREALLOCATE_STEP` tokens up to the context length (a short chat does not hold a
  whole 8k-token context in memory); a write inside the buffer is a slice assignment, and
  the buffer is re-allocated at most once per step. Writing past the context length raises
  :class:`ContextFull`.
- ``growing``: mlx-lm's :class:`~mlx_lm.models.cache.KVCache` (grows in 256-token steps).
- ``rotating``: a window of ``max_size`` tokens whose first ``keep`` tokens (the system
  prompt) are pinned; older tokens after them are evicted, so a conversation can go on past
  the context length. Built on mlx-lm's :class:`RotatingKVCache`, with a mask that keeps the
  pinned tokens visible to every query of a multi-token chunk (mlx-lm's window mask slides
  over them).

Models only call ``update_and_fetch``, ``make_mask`` and read ``offset``, so any mlx-lm
model and our ``.tinygpt`` module work with all three. Not promised: quantized KV, or
rotation for models whose own ``make_cache`` builds non-KV state (those keep their own caches).
"""

from __future__ import annotations

from typing import Literal

import mlx.core as mx
from mlx_lm.models.cache import KVCache, RotatingKVCache

from .errors import UserFacingError

CacheMode = Literal["preallocated", "growing", "rotating"]
KVSpec = tuple[int, int, mx.Dtype]  # kv heads, head dim, dtype
CACHE_MODES: tuple[str, ...] = ("preallocated", "growing", "rotating")
PREALLOCATE_STEP = 1024  # tokens per allocation of a preallocated cache


class ContextFull(UserFacingError, RuntimeError):
    """More tokens than a preallocated cache holds. ``fact`` is what happened, without the
    advice ``str()`` adds, for callers that give their own."""

    def __init__(self, fact: str, advice: str = ""):
        super().__init__(f"{fact} ({advice})" if advice else fact)
        self.fact = fact


class PreallocatedKVCache(KVCache):
    """A :class:`KVCache` whose buffer grows in steps of :data:`PREALLOCATE_STEP` tokens up to
    ``max_size``, the first step allocated from the first write (or from ``kv_spec``)."""

    def __init__(self, max_size: int, kv_spec: "KVSpec | None" = None):
        super().__init__()
        self.max_size = max_size
        if kv_spec is not None:  # allocate now, outside the first prefill's time
            heads, head_dim, dtype = kv_spec
            self.keys, self.values = self._buffers(1, heads, head_dim, head_dim, dtype, 1)

    def _buffers(self, batch, heads, dk, dv, dtype, tokens: int):
        size = min(self.max_size, -(-tokens // PREALLOCATE_STEP) * PREALLOCATE_STEP)
        return (mx.zeros((batch, heads, size, dk), dtype),
                mx.zeros((batch, heads, size, dv), dtype))

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        prev, n = self.offset, keys.shape[2]
        if prev + n > self.max_size:
            raise ContextFull(
                f"{prev + n} tokens do not fit a {self.max_size}-token KV cache"
            )
        if self.keys is None or prev + n > self.keys.shape[2]:
            B, H, _, Dk = keys.shape
            new_k, new_v = self._buffers(B, H, Dk, values.shape[3], keys.dtype, prev + n)
            if prev:
                new_k[..., :prev, :] = self.keys[..., :prev, :]
                new_v[..., :prev, :] = self.values[..., :prev, :]
            self.keys, self.values = new_k, new_v
        self.offset += n
        self.keys[..., prev : self.offset, :] = keys
        self.values[..., prev : self.offset, :] = values
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    @property
    def state(self):
        if self.keys is None:
            return None, None, 0
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :], self.offset

    @state.setter
    def state(self, v):
        keys, values, offset = v
        self.keys = self.values = None
        self.offset = 0
        if keys is not None and offset:
            self.update_and_fetch(keys[..., :offset, :], values[..., :offset, :])


class PinnedRotatingKVCache(RotatingKVCache):
    """mlx-lm's rotating cache, with pinned tokens visible to every query.

    mlx-lm masks a multi-token chunk with a plain sliding window, so late queries in a
    chunk lose sight of the ``keep`` tokens that the cache itself preserves. Here a query
    sees the pinned tokens plus the ``max_size - keep`` most recent ones (itself included),
    exactly what a one-token decode step sees.
    """

    def make_mask(self, N: int, window_size=None, return_array: bool = False):
        if N == 1:
            return None  # the buffer holds exactly what a single query may see
        held = 0 if self.keys is None else min(self.offset, self.keys.shape[2])
        # _update_concat trims the held tokens to max_size - 1 before appending the chunk.
        old = min(held, self.max_size - 1)
        if old + N <= self.max_size and not return_array:
            return "causal"
        q = mx.arange(old, old + N)[:, None]
        k = mx.arange(old + N)[None]
        recent = k > q - (self.max_size - self.keep)
        return (k <= q) & ((k < self.keep) | recent)


def make_cache(
    model, mode: CacheMode, max_size: int, *, keep: int = 0, kv_spec: KVSpec | None = None
) -> list:
    """One cache object per layer for ``model`` in the given mode.

    With ``kv_spec``, preallocated buffers are allocated (and zeroed) here rather than on
    the first write.
    """
    if mode not in CACHE_MODES:
        raise ValueError(f"unknown cache mode {mode!r}; choose one of {', '.join(CACHE_MODES)}")
    if max_size <= 0:
        raise ValueError(f"the KV cache needs a positive size, got {max_size}")
    own = model.make_cache() if hasattr(model, "make_cache") else None
    if own is not None and not all(type(c) is KVCache for c in own):
        return own  # hybrid/sliding models: their own cache layout is the correct one
    n = len(model.layers)
    if mode == "preallocated":
        caches = [PreallocatedKVCache(max_size, kv_spec) for _ in range(n)]
        if kv_spec is not None:
            mx.eval([(c.keys, c.values) for c in caches])
        return caches
    if mode == "rotating":
        if not 0 <= keep < max_size:
            raise ValueError(f"cannot pin {keep} tokens in a {max_size}-token window")
        return [PinnedRotatingKVCache(max_size=max_size, keep=keep) for _ in range(n)]
    return [KVCache() for _ in range(n)]


def set_pinned(cache: list, keep: int) -> bool:
    """Pin the first ``keep`` tokens of rotating caches that have not rotated yet."""
    changed = False
    for c in cache:
        if isinstance(c, RotatingKVCache) and c.offset < c.max_size:
            if not 0 <= keep < c.max_size:
                raise ValueError(f"cannot pin {keep} tokens in a {c.max_size}-token window")
            c.keep = keep
            changed = True
    return changed


def trimmable(cache: list) -> bool:
    return all(c.is_trimmable() for c in cache)


def nbytes(cache: list) -> int:
    return sum(c.nbytes for c in cache)
