"""Persistent prompt caches: a prompt's KV state on disk, keyed so a wrong hit cannot happen.

One ``.safetensors`` file per key in the format of :mod:`mlx_agent.cache_file` (version 2):
per layer ``keys.{i}`` and ``values.{i}`` (``[1, kv_heads, T, head_dim]``; in int8 files,
packed words with ``.scales`` and ``.biases``: see :class:`cache_file.Layout`) and the
prompt's ``token_ids``; string metadata holds the format version, the key, the model
identity, the cache mode, the creation time and an HMAC-SHA-256 keyed by the user's secret
(:mod:`mlx_agent.user_key`).
Nothing is unpickled or built from a name found in a file. Sessions (:func:`save_session`) are
the same format with the conversation in the metadata.

Keys and values are stored in float16 when the model's KV cache is float32 (half the bytes;
logits after a load drift from a fresh prefill's by about 1e-4 relative, measured by
tests/test_prompt_cache.py) and as they are otherwise; ``storage="float32"`` keeps
float32 files, whose loads give the fresh prefill's logits exactly; ``storage="int8"``
stores them as ``mx.quantize`` does weights, 8 bits with a float16 scale and bias per group
of 64 (or 32) along the head: about 0.53 of float16's bytes, for a drift of about 4e-3 on the
bundled model (tests/test_prompt_cache.py bounds it at 1e-2).

The key is a SHA-256 over a canonical JSON of everything that changes the KV state: model
name, file fingerprint, adapter fingerprint, vocabulary hash, layer count, KV dtype and head
shape, the storage dtype, cache mode, format version and the prompt's exact token ids (files
written before the storage dtype was part of the key are never found, so never loaded). File
names are ``<model-slug>-<16 hex>.safetensors``.

Writes are atomic (a temporary file in the same directory, fsync, rename), so concurrent
writers or a killed process never leave a file that loads wrong. Loading checks the header
against the model and the prompt before reading any tensor data, then the MAC; a truncated,
corrupt, tampered, unauthenticated (another user's key, format 1) or mismatched file, or one
that is not a regular file, is reported through ``warn``, ignored, and replaced by the next
save. An unusable key file is one warning, and the run goes on without the cache; a directory
that cannot be written is a warning too. "Last used" is the file's mtime, refreshed on every
hit; :func:`prune` removes least recently used files first and never deletes a file whose
header is not a prompt cache's. Not promised: secrecy (files are not encrypted), or anything
against someone who can read the user's key.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Callable, Literal, Sequence

import mlx.core as mx
import msgspec

from . import cache_file, user_key
from .cache_file import FORMAT_VERSION, CacheFile, Layout, int8_group, kind_of, printable

SUFFIX = ".safetensors"
_STALE_TMP_SECONDS = 600
STORAGE_DTYPES = ("float16", "float32", "int8")
DEFAULT_STORAGE_DTYPE = "float16"

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
    problem: str = ""  # why it can never load; "" when it may


def storage_dtype(kv_dtype: str, requested: str = DEFAULT_STORAGE_DTYPE) -> str:
    """The dtype a file stores keys and values in: ``requested`` for a float32 KV cache,
    the cache's own otherwise (float16 and bfloat16 are already two bytes), and int8
    whenever it is asked for."""
    if requested not in STORAGE_DTYPES:
        raise ValueError(f"unknown storage dtype {requested!r}; choose one of "
                         f"{', '.join(STORAGE_DTYPES)}")
    return requested if kv_dtype == "float32" or requested == "int8" else kv_dtype


def cache_key(identity, token_ids: Sequence[int], cache_mode: str,
              storage: str = DEFAULT_STORAGE_DTYPE) -> str:
    """SHA-256 (hex) over everything that determines a prompt's KV state and its file."""
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
        "storage": storage_dtype(ident["kv_dtype"], storage),
        "tokens": list(map(int, token_ids)),
    }
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:48] or "model"


def file_for(directory: Path, identity, key: str) -> Path:
    return Path(directory) / f"{slug(identity.name)}-{key[:16]}{SUFFIX}"


def kv_arrays(token_ids: Sequence[int], kvs) -> dict[str, mx.array]:
    """The tensors of a file: token ids and, when there are tokens, each layer's KV."""
    arrays = {"token_ids": mx.array(list(token_ids), dtype=mx.int32)}
    for i, (k, v) in enumerate(kvs if len(token_ids) else ()):
        arrays[f"keys.{i}"], arrays[f"values.{i}"] = k, v
    return arrays


def stored_arrays(token_ids: Sequence[int], kvs, storage: str) -> dict[str, mx.array]:
    """:func:`kv_arrays` with keys and values in the ``storage`` dtype; int8 as
    ``mx.quantize`` packs it (see :class:`cache_file.Layout`)."""
    if storage != "int8":
        dtype = getattr(mx, storage)
        return kv_arrays(token_ids, [(k.astype(dtype), v.astype(dtype)) for k, v in kvs])
    arrays = kv_arrays(token_ids, ())
    for i, (k, v) in enumerate(kvs if len(token_ids) else ()):
        for name, x in ((f"keys.{i}", k), (f"values.{i}", v)):
            group = int8_group(x.shape[-1])
            if group is None:
                raise ValueError(f"a head size of {x.shape[-1]} cannot be stored in int8; "
                                 "use float16")
            words, scales, biases = mx.quantize(x.reshape(-1, x.shape[-1]), group_size=group,
                                                bits=8)
            lead = x.shape[:-1]
            arrays[name] = words.reshape(*lead, -1)
            arrays[f"{name}.scales"] = scales.astype(mx.float16).reshape(*lead, -1)
            arrays[f"{name}.biases"] = biases.astype(mx.float16).reshape(*lead, -1)
    return arrays


def _kv_pairs(arrays: dict[str, mx.array], layers: int, dtype: str | None = None) -> list:
    """Per-layer (keys, values) of arrays that :class:`cache_file.Layout` has checked, in
    ``dtype`` when given (8-bit ones dequantized)."""
    def one(name: str) -> mx.array:
        x = arrays[name]
        if x.dtype != mx.uint32:
            return x
        # mx.quantize's 8-bit words hold four values, the first in the lowest byte; done
        # here in float32 (mx.dequantize works in the scales' float16, and 7x slower on
        # the CPU)
        scales, biases = arrays[f"{name}.scales"], arrays[f"{name}.biases"]
        lead, groups = x.shape[:-1], scales.shape[-1]
        q = x.view(mx.uint8).reshape(*lead, groups, -1).astype(mx.float32)
        value = q * scales.astype(mx.float32)[..., None] + biases.astype(mx.float32)[..., None]
        return value.reshape(*lead, -1)

    pairs = [(one(f"keys.{i}"), one(f"values.{i}")) for i in range(layers)]
    if dtype is None:
        return pairs
    pairs = [(k.astype(getattr(mx, dtype)), v.astype(getattr(mx, dtype))) for k, v in pairs]
    mx.eval(pairs)
    return pairs


class PromptCache:
    """A directory of prompt caches, plus the last few in memory for tasks in one process."""

    def __init__(self, directory: str | os.PathLike, *, warn: Warn = lambda m: None,
                 max_bytes: int | None = None, memory_entries: int = 2,
                 key_file: str | os.PathLike | None = None,
                 storage: str = DEFAULT_STORAGE_DTYPE):
        storage_dtype("float32", storage)  # an unknown dtype fails here, not on first use
        self.dir = Path(directory).expanduser()
        self.storage = storage
        self.warn = warn
        self.max_bytes = max_bytes
        self._memory: dict[str, tuple[list[int], list]] = {}
        self._memory_entries = memory_entries
        self._key_file = key_file
        self._secret: bytes | None = None
        self._off = False

    def _remember(self, key: str, tokens: list[int], kvs: list) -> None:
        self._memory.pop(key, None)
        self._memory[key] = (tokens, kvs)
        while len(self._memory) > self._memory_entries:
            self._memory.pop(next(iter(self._memory)))

    def _user_key(self) -> bytes | None:
        """The key that authenticates files; None (after one warning) when it is unusable."""
        if self._secret is None and not self._off:
            try:
                self._secret = user_key.load(self._key_file)
            except user_key.KeyFileError as e:
                self._off = True
                self.warn(f"{e}; the prompt cache is off for this run")
        return self._secret

    def prime(self, engine, identity, token_ids: Sequence[int]) -> Hit:
        """Make ``engine`` hold ``token_ids``: from memory, from disk, or by prefilling and
        saving."""
        token_ids = list(token_ids)
        key = cache_key(identity, token_ids, engine.cache_mode, self.storage)
        path = file_for(self.dir, identity, key)
        start = time.perf_counter()
        # a rotating window shorter than the prompt computes it otherwise than any saved
        # state (which a window can only have saved whole): prefill it
        fits = engine.computes_whole(len(token_ids))
        if key in self._memory and fits:
            tokens, kvs = self._memory[key]
            engine.restore(tokens, kvs)
            return Hit(key, len(tokens), _size(path), time.perf_counter() - start, True)
        secret = self._user_key()
        if secret is not None and fits:
            try:
                kvs = self._load(path, secret, identity, key, token_ids)
                engine.restore(token_ids, kvs)
                self._remember(key, token_ids, kvs)
                _touch(path)
                return Hit(key, len(token_ids), _size(path), time.perf_counter() - start, True)
            except (FileNotFoundError, NotADirectoryError):
                pass  # not saved yet: a plain miss
            except (ValueError, OSError) as e:
                self.warn(f"prompt cache {path.name} is not usable: {_reason(e)}; rebuilding it")
                engine.reset(keep=engine.pinned)
        engine.sync(token_ids)
        try:
            _, kvs = engine.snapshot()
        except ValueError as e:  # a prompt longer than a rotating window
            self.warn(f"cannot save the prompt cache: {e}; continuing without it")
            return Hit(key, len(token_ids), 0, time.perf_counter() - start, False)
        size = 0 if secret is None else self._save(path, identity, key, token_ids, kvs,
                                                   engine.cache_mode, secret)
        self._remember(key, token_ids, kvs)
        return Hit(key, len(token_ids), size, time.perf_counter() - start, False)

    def _load(self, path: Path, secret: bytes, identity, key: str, token_ids: list[int]) -> list:
        stored = storage_dtype(identity.kv_dtype, self.storage)
        with CacheFile(path) as f:
            if f.metadata.get("key") != key or f.metadata.get("kind") != "prompt":
                raise ValueError("its metadata names another key")
            arrays = f.load(secret, replace(Layout.of(identity, len(token_ids)), kv_dtype=stored))
        if arrays["token_ids"].tolist() != token_ids:
            raise ValueError("its token ids differ from this prompt's")
        return _kv_pairs(arrays, identity.num_layers,
                         identity.kv_dtype if stored != identity.kv_dtype else None)

    def _save(self, path, identity, key, token_ids, kvs, cache_mode, secret) -> int:
        meta = {
            "key": key, "kind": "prompt",
            "model": identity.name, "identity": msgspec.json.encode(identity).decode(),
            "cache_mode": cache_mode, "tokens": str(len(token_ids)),
            "created": f"{time.time():.3f}",
        }
        try:
            arrays = stored_arrays(token_ids, kvs, storage_dtype(identity.kv_dtype,
                                                                 self.storage))
        except ValueError as e:  # a model whose heads int8 cannot take
            self.warn(f"cannot save the prompt cache: {e}; continuing without it")
            return 0
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            _clean_stale_tmp(self.dir)
            size = cache_file.write(path, arrays, meta, secret)
        except OSError as e:
            self.warn(f"cannot save the prompt cache in {self.dir}: {e.strerror or e}; "
                      "continuing without it")
            return 0
        if self.max_bytes is not None:
            for gone in prune(self.dir, self.max_bytes, keep=path, warn=lambda m: self.warn(
                    f"cannot prune the prompt cache in {self.dir}: {m}")):
                self.warn(f"pruned prompt cache {gone.path.name} ({gone.bytes} bytes)")
        return size


def save_session(path: str | os.PathLike, identity, engine, protocol: str, state: dict) -> int:
    """Write a conversation (protocol state, token ids, KV) atomically; returns its size.
    Raises OSError (a :class:`user_key.KeyFileError` when the key is unusable).

    When a rotating window has evicted tokens, only the conversation is saved and resuming
    prefills it again.
    """
    try:
        tokens, kvs = engine.snapshot()
    except ValueError:
        tokens, kvs = [], []
    meta = {
        "kind": "session", "model": identity.name,
        "identity": msgspec.json.encode(identity).decode(), "cache_mode": engine.cache_mode,
        "protocol": protocol, "state": json.dumps(state), "created": f"{time.time():.3f}",
    }
    return cache_file.write(Path(path), kv_arrays(tokens, kvs), meta, user_key.load())


def load_session(path: str | os.PathLike, identity,
                 max_tokens: int | None = None) -> tuple[str, dict, list[int], list]:
    """(protocol, state, token ids, per-layer KV) of a session; raises ValueError when it is
    damaged, unauthenticated, was made by another model, or holds more than ``max_tokens``
    (checked from its header: a sparse file can claim gigabytes). Token ids and KV are empty
    when only the conversation was saved."""
    try:
        secret = user_key.load()
        with CacheFile(path, follow_symlinks=True) as f:  # a path the user named
            if f.metadata.get("kind") != "session":
                raise ValueError("it is not a session file")
            if f.metadata.get("identity") != msgspec.json.encode(identity).decode():
                model = printable(f.metadata.get("model", "?"), 64)
                raise ValueError(f"it was saved with model {model!r} (a different model, "
                                 "adapter or weight format)")
            arrays = f.load(secret, Layout.of(identity, max_tokens=max_tokens))
            meta = f.metadata
    except OSError as e:
        raise ValueError(_reason(e)) from None
    try:
        state = json.loads(meta["state"])
    except (KeyError, ValueError, RecursionError):
        raise ValueError("its conversation state is unreadable") from None
    ids = arrays["token_ids"].tolist()
    kvs = _kv_pairs(arrays, identity.num_layers) if ids else []
    return meta.get("protocol", ""), state, ids, kvs


def _reason(e: Exception) -> str:
    return (e.strerror or str(e)) if isinstance(e, OSError) else str(e)


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
            if now - p.lstat().st_mtime > _STALE_TMP_SECONDS:
                p.unlink()
        except OSError:
            pass


class _Listed(msgspec.Struct):
    """The metadata ``cache ls`` shows, as a prompt cache of any format writes it."""

    kind: Literal["prompt"]
    # \Z, not $: "$" also matches before a final newline
    key: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}\Z")]
    tokens: Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,10}\Z")]
    created: Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,10}(\.[0-9]{1,9})?\Z")]
    model: str = "?"
    format: str = ""


def entries(directory: str | os.PathLike) -> list[Entry]:
    """Every ``*.safetensors`` in ``directory``, most recently used first, from headers only
    (authentication happens on load). A file that can never load comes back with ``problem``
    set, and with an empty ``key`` unless its metadata is a prompt cache's."""
    out = []
    for p in Path(directory).expanduser().glob(f"*{SUFFIX}"):
        if p.name.startswith("."):
            continue
        try:
            st = p.lstat()
        except OSError:
            continue  # removed meanwhile
        entry = _entry(p, st)
        if entry is not None:
            out.append(entry)
    return sorted(out, key=lambda e: e.last_used, reverse=True)


def _entry(path: Path, st: os.stat_result) -> Entry | None:
    """``path``'s entry; None when it was removed meanwhile (another process pruning)."""
    unknown = Entry(key="", path=path, model="?", tokens=0, bytes=st.st_size,
                    created=st.st_mtime, last_used=st.st_mtime)
    if not stat.S_ISREG(st.st_mode):
        return replace(unknown, problem=f"it is not a regular file ({kind_of(st.st_mode)})")
    try:
        with CacheFile(path) as f:
            meta = msgspec.convert(f.metadata, _Listed)
    except msgspec.ValidationError as e:  # before ValueError: it is one
        return replace(unknown, problem=f"its metadata is not a prompt cache's "
                                        f"({printable(str(e))})")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return replace(unknown, problem=_reason(e))
    problem = ""
    if meta.format != str(FORMAT_VERSION):
        problem = (f"it was written by another version of mlx_agent (format "
                   f"{printable(meta.format, 8)!r}, this one reads {FORMAT_VERSION})")
    return replace(unknown, key=meta.key, model=printable(meta.model, 48),
                   tokens=int(meta.tokens), created=float(meta.created), problem=problem)


def remove(directory: str | os.PathLike, key: str,
           warn: Warn | None = None) -> tuple[list[Entry], int]:
    """Remove the entries whose key starts with ``key`` (at least 6 hex digits, either case):
    those removed, and how many matched in all. One that cannot be deleted is reported
    through ``warn`` and skipped, as :func:`prune` does; without ``warn``, its OSError (see
    :func:`_unlink`) is raised."""
    if len(key) < 6:
        raise ValueError("give at least 6 characters of the key")
    key = key.lower()  # keys are written in lowercase hex; one copied from elsewhere may not be
    matched = [e for e in entries(directory) if e.key and e.key.startswith(key)]
    gone = []
    for e in matched:
        if _removed(e.path, warn):
            gone.append(e)
    return gone, len(matched)


def prune(directory: str | os.PathLike, max_bytes: int, keep: Path | None = None,
          warn: Warn | None = None) -> list[Entry]:
    """Delete least recently used prompt caches until they take at most ``max_bytes``.
    Files whose metadata is not a prompt cache's are never deleted (nor counted). One that
    cannot be deleted is reported through ``warn`` and skipped (another user's file in a
    shared folder must not stop the pruning for good); without ``warn``, its OSError (see
    :func:`_unlink`) is raised."""
    current = [e for e in entries(directory) if e.key]
    total = sum(e.bytes for e in current)
    gone = []
    for e in reversed(current):  # least recently used first
        if total <= max_bytes:
            break
        if keep is not None and e.path == keep:
            continue
        if _removed(e.path, warn):
            total -= e.bytes
            gone.append(e)
    return gone


def _removed(path: Path, warn: Warn | None) -> bool:
    """Whether ``path`` is deleted: one that cannot be is said through ``warn`` (False), or
    without ``warn`` its OSError (see :func:`_unlink`) is raised."""
    try:
        _unlink(path)
    except OSError as err:
        if warn is None:
            raise
        warn(err.strerror)
        return False
    return True


def _unlink(path: Path) -> None:
    """Delete ``path`` (gone already is fine); an OSError whose ``strerror`` names the file
    when it cannot be (a read-only disk, another user's file in a shared folder)."""
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        raise OSError(e.errno, f"cannot remove {printable(path.name)}: {e.strerror}",
                      str(path)) from None
