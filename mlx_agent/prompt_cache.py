"""Persistent prompt caches: a prompt's KV state on disk, keyed so a wrong hit cannot happen.

One ``.safetensors`` file per key, written by MLX: per layer ``keys.{i}`` and ``values.{i}``
(``[1, kv_heads, T, head_dim]``) and the prompt's ``token_ids``; string metadata holds the
format version, the key, the model identity, the cache mode, the shapes, a SHA-256 of the
tensor bytes and the creation time. Nothing is unpickled or built from a name found in a file.

The key is a SHA-256 over a canonical JSON of everything that changes the KV state: model
name, file fingerprint, adapter fingerprint, vocabulary hash, layer count, KV dtype and head
shape, cache mode, format version and the prompt's exact token ids. File names are
``<model-slug>-<16 hex>.safetensors``.

Writes are atomic (a temporary file in the same directory, fsync, rename), so concurrent
writers or a killed process never leave a file that loads wrong. Loading checks everything
against the model and the prompt before use; a truncated, corrupt, tampered or mismatched file
is reported through ``warn``, ignored, and replaced by the next save. A directory that cannot
be written is a warning too: the run goes on without saving. "Last used" is the file's mtime,
refreshed on every hit; :func:`prune` removes least recently used files first.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import mlx.core as mx
import msgspec

from .fileio import atomic_path

FORMAT_VERSION = 1
SUFFIX = ".safetensors"
_STALE_TMP_SECONDS = 600

Warn = Callable[[str], None]


@dataclass(frozen=True)
class Hit:
    key: str
    tokens: int
    bytes: int
    seconds: float  # load time on a hit, prefill + save time on a miss
    hit: bool


@dataclass(frozen=True)
class Entry:
    key: str
    path: Path
    model: str
    tokens: int
    bytes: int
    created: float
    last_used: float


def cache_key(identity, token_ids: Sequence[int], cache_mode: str) -> str:
    """SHA-256 (hex) over everything that determines a prompt's KV state."""
    ident = msgspec.to_builtins(identity)
    fields = {
        "format": FORMAT_VERSION,
        "model": ident["name"],
        "fingerprint": ident["fingerprint"],
        "adapter": ident["adapter_fingerprint"],
        "vocab": ident["vocab_hash"],
        "layers": ident["num_layers"],
        "kv_dtype": ident["kv_dtype"],
        "kv_heads": ident["kv_heads"],
        "head_dim": ident["head_dim"],
        "weights": ident["weight_format"],
        "cache_mode": cache_mode,
        "tokens": list(map(int, token_ids)),
    }
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:48] or "model"


def file_for(directory: Path, identity, key: str) -> Path:
    return Path(directory) / f"{slug(identity.name)}-{key[:16]}{SUFFIX}"


def _digest(arrays: dict[str, mx.array]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        h.update(name.encode())
        h.update(memoryview(mx.contiguous(arrays[name])))
    return h.hexdigest()


def write_state(path: Path, arrays: dict[str, mx.array], metadata: dict[str, str]) -> int:
    """Write atomically; returns the file's size. Raises OSError when the directory refuses."""
    path = Path(path)
    mx.eval(list(arrays.values()))
    metadata = {**metadata, "sha256": _digest(arrays)}
    with atomic_path(path, suffix=".tmp" + SUFFIX) as tmp:
        mx.save_safetensors(str(tmp), arrays, metadata)
    return path.stat().st_size


def read_state(path: Path) -> tuple[dict[str, mx.array], dict[str, str]]:
    """Arrays and metadata, checksum verified; raises ValueError on any damage."""
    try:
        arrays, metadata = mx.load(str(path), format="safetensors", return_metadata=True)
    except Exception as e:  # MLX reports damage as bare runtime errors
        raise ValueError(f"unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if metadata.get("sha256") != _digest(arrays):
        raise ValueError("checksum mismatch (the file was modified or damaged)")
    return arrays, metadata


def kv_arrays(token_ids: Sequence[int], kvs) -> dict[str, mx.array]:
    arrays = {"token_ids": mx.array(list(token_ids), dtype=mx.int32)}
    for i, (k, v) in enumerate(kvs):
        arrays[f"keys.{i}"], arrays[f"values.{i}"] = k, v
    return arrays


def check_kv(arrays: dict[str, mx.array], identity, token_ids: Sequence[int] | None) -> list:
    """The per-layer (keys, values) in ``arrays`` after checking them against the model."""
    ids = arrays.get("token_ids")
    if ids is None or ids.ndim != 1:
        raise ValueError("no token_ids")
    n = ids.shape[0]
    if token_ids is not None and ids.tolist() != list(token_ids):
        raise ValueError("its token ids differ from this prompt's")
    want = (1, identity.kv_heads, n, identity.head_dim)
    dtype = getattr(mx, identity.kv_dtype)
    kvs = []
    for i in range(identity.num_layers):
        k, v = arrays.get(f"keys.{i}"), arrays.get(f"values.{i}")
        for name, a in (("keys", k), ("values", v)):
            if a is None:
                raise ValueError(f"layer {i} has no {name}")
            if tuple(a.shape) != want or a.dtype != dtype:
                raise ValueError(f"layer {i} {name} are {tuple(a.shape)} {a.dtype}, the model "
                                 f"needs {want} {dtype}")
        kvs.append((k, v))
    extra = set(arrays) - {"token_ids"} - {f"{p}.{i}" for p in ("keys", "values")
                                           for i in range(identity.num_layers)}
    if extra:
        raise ValueError(f"unexpected tensors ({sorted(extra)[0]}, ...)")
    return kvs


class PromptCache:
    """A directory of prompt caches, plus the last few in memory for tasks in one process."""

    def __init__(self, directory: str | os.PathLike, *, warn: Warn = lambda m: None,
                 max_bytes: int | None = None, memory_entries: int = 2):
        self.dir = Path(directory).expanduser()
        self.warn = warn
        self.max_bytes = max_bytes
        self._memory: dict[str, tuple[list[int], list]] = {}
        self._memory_entries = memory_entries

    def _remember(self, key: str, tokens: list[int], kvs: list) -> None:
        self._memory.pop(key, None)
        self._memory[key] = (tokens, kvs)
        while len(self._memory) > self._memory_entries:
            self._memory.pop(next(iter(self._memory)))

    def prime(self, engine, identity, token_ids: Sequence[int]) -> Hit:
        """Make ``engine`` hold ``token_ids``: from memory, from disk, or by prefilling and saving."""
        token_ids = list(token_ids)
        key = cache_key(identity, token_ids, engine.cache_mode)
        path = file_for(self.dir, identity, key)
        start = time.perf_counter()
        if key in self._memory:
            tokens, kvs = self._memory[key]
            engine.restore(tokens, kvs)
            return Hit(key, len(tokens), _size(path), time.perf_counter() - start, True)
        if path.exists():
            try:
                arrays, meta = read_state(path)
                if meta.get("key") != key or meta.get("format") != str(FORMAT_VERSION):
                    raise ValueError("its metadata names another key or format")
                kvs = check_kv(arrays, identity, token_ids)
                engine.restore(token_ids, kvs)
                self._remember(key, token_ids, kvs)
                _touch(path)
                return Hit(key, len(token_ids), _size(path), time.perf_counter() - start, True)
            except (ValueError, OSError) as e:
                self.warn(f"prompt cache {path.name} is not usable: {e}; rebuilding it")
                engine.reset(keep=engine.pinned)
        engine.sync(token_ids)
        _, kvs = engine.snapshot()
        size = self._save(path, identity, key, token_ids, kvs, engine.cache_mode)
        self._remember(key, token_ids, kvs)
        return Hit(key, len(token_ids), size, time.perf_counter() - start, False)

    def _save(self, path, identity, key, token_ids, kvs, cache_mode) -> int:
        meta = {
            "format": str(FORMAT_VERSION), "key": key, "kind": "prompt",
            "model": identity.name, "identity": msgspec.json.encode(identity).decode(),
            "cache_mode": cache_mode, "tokens": str(len(token_ids)),
            "created": f"{time.time():.3f}",
        }
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            _clean_stale_tmp(self.dir)
            size = write_state(path, kv_arrays(token_ids, kvs), meta)
        except OSError as e:
            self.warn(f"cannot save the prompt cache in {self.dir}: {e.strerror or e}; "
                      "continuing without it")
            return 0
        if self.max_bytes is not None:
            for gone in prune(self.dir, self.max_bytes, keep=path):
                self.warn(f"pruned prompt cache {gone.path.name} ({gone.bytes} bytes)")
        return size


def save_session(path: str | os.PathLike, identity, engine, protocol: str, state: dict) -> int:
    """Write a conversation (protocol state, token ids, KV) atomically; returns its size.

    When a rotating window has evicted tokens, only the conversation is saved and resuming
    prefills it again.
    """
    try:
        tokens, kvs = engine.snapshot()
        arrays = kv_arrays(tokens, kvs)
    except ValueError:
        arrays = {"token_ids": mx.array([], dtype=mx.int32)}
    meta = {
        "format": str(FORMAT_VERSION), "kind": "session", "model": identity.name,
        "identity": msgspec.json.encode(identity).decode(), "cache_mode": engine.cache_mode,
        "protocol": protocol, "state": json.dumps(state), "created": f"{time.time():.3f}",
    }
    return write_state(Path(path), arrays, meta)


def load_session(path: str | os.PathLike, identity) -> tuple[str, dict, list[int], list]:
    """(protocol, state, token ids, per-layer KV) of a session; raises ValueError when it is
    damaged or was made by another model. Token ids and KV are empty when only the
    conversation was saved."""
    arrays, meta = read_state(Path(path))
    if meta.get("kind") != "session" or meta.get("format") != str(FORMAT_VERSION):
        raise ValueError("not a session file of this version")
    if meta.get("identity") != msgspec.json.encode(identity).decode():
        raise ValueError(f"it was saved with model {meta.get('model')!r} (a different model, "
                         "adapter or weight format)")
    try:
        state = json.loads(meta["state"])
    except (KeyError, json.JSONDecodeError):
        raise ValueError("its conversation state is unreadable") from None
    ids = arrays.get("token_ids")
    if ids is None or ids.size == 0:
        return meta.get("protocol", ""), state, [], []
    return meta.get("protocol", ""), state, ids.tolist(), check_kv(arrays, identity, None)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _clean_stale_tmp(directory: Path) -> None:
    now = time.time()
    for p in directory.glob(f".*.tmp{SUFFIX}"):
        try:
            if now - p.stat().st_mtime > _STALE_TMP_SECONDS:
                p.unlink()
        except OSError:
            pass


def entries(directory: str | os.PathLike) -> list[Entry]:
    """The cache files in ``directory`` (those whose header reads), most recently used first."""
    out = []
    for p in Path(directory).expanduser().glob(f"*{SUFFIX}"):
        if p.name.startswith("."):
            continue
        try:
            meta = _header(p)
            st = p.stat()
        except (OSError, ValueError):
            continue
        out.append(Entry(key=meta.get("key", "?"), path=p, model=meta.get("model", "?"),
                         tokens=int(meta.get("tokens", 0)), bytes=st.st_size,
                         created=float(meta.get("created", st.st_mtime)),
                         last_used=st.st_mtime))
    return sorted(out, key=lambda e: e.last_used, reverse=True)


def _header(path: Path) -> dict[str, str]:
    """A safetensors file's ``__metadata__`` without reading its tensors."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("too short")
        n = int.from_bytes(raw, "little")
        if n > 100 << 20:
            raise ValueError("header too large")
        header = json.loads(f.read(n))
    return header.get("__metadata__", {}) if isinstance(header, dict) else {}


def remove(directory: str | os.PathLike, key: str) -> list[Entry]:
    """Remove the entries whose key starts with ``key`` (at least 6 hex digits)."""
    if len(key) < 6:
        raise ValueError("give at least 6 characters of the key")
    gone = [e for e in entries(directory) if e.key.startswith(key)]
    for e in gone:
        e.path.unlink(missing_ok=True)
    return gone


def prune(directory: str | os.PathLike, max_bytes: int, keep: Path | None = None) -> list[Entry]:
    """Delete least recently used entries until the directory holds at most ``max_bytes``."""
    current = entries(directory)
    total = sum(e.bytes for e in current)
    gone = []
    for e in reversed(current):  # least recently used first
        if total <= max_bytes:
            break
        if keep is not None and e.path == keep:
            continue
        e.path.unlink(missing_ok=True)
        total -= e.bytes
        gone.append(e)
    return gone
