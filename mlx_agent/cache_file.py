"""The prompt-cache and session file format (version 2): safetensors, authenticated.

A file is plain safetensors: 8 bytes of header length (little-endian), a JSON header, the tensor
data. The header's string ``__metadata__`` carries ``format`` ("2") and ``mac``: an HMAC-SHA-256,
keyed by the user's secret (:mod:`mlx_agent.user_key`), over the rest of the metadata, every
tensor's name, dtype and shape, and the tensor bytes. A file changed after it was written, or
written with another key, fails the MAC and is never loaded. Format 1 (a bare SHA-256, which
anyone who edits the file can recompute) is refused as "written by an older mlx_agent".

Reading is defensive, in this order: open without blocking (and, for cache directories,
without following a symbolic link); refuse anything but a regular file; read the header only
(its declared length checked against the file size first) and parse it into typed fields, so a
header of the wrong shape or depth is a one-line error, never a recursion or a crash; check
every tensor's dtype, shape and offsets against the file size; then (:meth:`CacheFile.load`)
check the names, dtypes and shapes against the :class:`Layout` the model expects. Only then is
the data read, once, from the same descriptor, authenticated, and turned into arrays.

Every problem with a file is a ``ValueError`` with a short reason; the OS's own refusals are
``OSError``. Not promised: secrecy (nothing is encrypted), or protection against someone who
holds the user's key.
"""

from __future__ import annotations

import errno
import hmac
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import mlx.core as mx
import msgspec
import numpy as np

from .fileio import atomic_path

FORMAT_VERSION = 2
MAX_HEADER_BYTES = 100 << 20
_MAC_DOMAIN = b"mlx_agent cache file 2\n"
# safetensors dtype -> (MLX dtype, how numpy reads its bytes; bfloat16 as raw 16-bit words)
_DTYPES = {"F32": (mx.float32, "<f4"), "F16": (mx.float16, "<f2"),
           "BF16": (mx.bfloat16, "<u2"), "I32": (mx.int32, "<i4"), "U32": (mx.uint32, "<u4")}
_NAMES = {mlx: name for name, (mlx, _) in _DTYPES.items()}

Count = Annotated[int, msgspec.Meta(ge=0)]


class Tensor(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    dtype: str
    shape: tuple[Count, ...]
    data_offsets: tuple[Count, Count]

    def nbytes(self) -> int:
        n = np.dtype(_DTYPES[self.dtype][1]).itemsize
        for d in self.shape:
            n *= d
        return n


# Values may only be strings (metadata) or lists of integers (tensor fields), so no value can
# nest: a deep or oddly shaped header fails at its first wrong token.
_RawHeader = dict[str, dict[str, str | list[int]]]


def int8_group(head_dim: int) -> int | None:
    """The group size of 8-bit KV storage (``mx.quantize``'s, along the head dimension), or
    None when ``head_dim`` takes none."""
    return next((g for g in (64, 32) if head_dim % g == 0), None)


@dataclass(frozen=True)
class Layout:
    """The tensors a file must hold: ``token_ids`` and, when there are tokens, each layer's
    ``keys.{i}`` and ``values.{i}`` of shape ``[1, kv_heads, tokens, head_dim]``; with
    ``kv_dtype="int8"``, those as ``mx.quantize`` packs them 8 bits to a value (uint32,
    ``head_dim / 4`` words) with float16 ``.scales`` and ``.biases`` per group
    (:func:`int8_group`)."""

    layers: int
    kv_heads: int
    head_dim: int
    kv_dtype: str
    tokens: int | None = None  # None: any number
    max_tokens: int | None = None  # with ``tokens`` None: at most this many (a context's)

    @classmethod
    def of(cls, identity, tokens: int | None = None, max_tokens: int | None = None) -> Layout:
        return cls(identity.num_layers, identity.kv_heads, identity.head_dim,
                   identity.kv_dtype, tokens, max_tokens)

    def check(self, tensors: dict[str, Tensor]) -> None:
        ids = tensors.get("token_ids")
        if ids is None or ids.dtype != "I32" or len(ids.shape) != 1:
            raise ValueError("it has no token_ids")
        n = ids.shape[0]
        if self.tokens is not None and n != self.tokens:
            raise ValueError(f"it holds {n} tokens, this prompt has {self.tokens}")
        if self.max_tokens is not None and n > self.max_tokens:  # before its data is read
            raise ValueError(f"it holds {n} tokens, more than the {self.max_tokens}-token "
                             "context")
        want = {"token_ids": ("I32", (n,))}
        for i in range(self.layers if n else 0):
            for name in (f"keys.{i}", f"values.{i}"):
                want.update(self._kv(name, n))
        extra = sorted(tensors.keys() - want.keys())
        if extra:
            raise ValueError(f"it holds an unexpected tensor {printable(extra[0], 64)!r}")
        for name, (dtype, shape) in want.items():
            t = tensors.get(name)
            if t is None:
                raise ValueError(f"it has no {name}")
            if t.shape == shape and t.dtype != dtype and name != "token_ids":
                raise ValueError(f"its KV state is {t.dtype}, this run keeps {dtype} (the "
                                 "weight format or $MLX_AGENT_KV_DTYPE differ from when it "
                                 "was written); run with the same settings to use it")
            if (t.dtype, t.shape) != (dtype, shape):
                raise ValueError(f"its {name} is {list(t.shape)} {t.dtype}, the model needs "
                                 f"{list(shape)} {dtype}")

    def _kv(self, name: str, n: int) -> dict[str, tuple[str, tuple[int, ...]]]:
        lead = (1, self.kv_heads, n)
        if self.kv_dtype != "int8":
            return {name: (_NAMES[getattr(mx, self.kv_dtype)], (*lead, self.head_dim))}
        group = int8_group(self.head_dim)
        if group is None:
            raise ValueError(f"it stores 8-bit KV, which a head size of {self.head_dim} "
                             "cannot take")
        groups = (*lead, self.head_dim // group)
        return {name: ("U32", (*lead, self.head_dim // 4)), f"{name}.scales": ("F16", groups),
                f"{name}.biases": ("F16", groups)}


class CacheFile:
    """An open file whose header has been read and checked; no tensor data is read yet."""

    def __init__(self, path: str | os.PathLike, *, follow_symlinks: bool = False):
        self.path = Path(path)
        self._fd = _open_regular(self.path, follow_symlinks)
        try:
            self.size = os.fstat(self._fd).st_size
            self.metadata, self.tensors, self._data_start = _read_header(self._fd, self.size)
        except BaseException:
            os.close(self._fd)
            raise

    def __enter__(self) -> CacheFile:
        return self

    def __exit__(self, *exc) -> None:
        os.close(self._fd)

    def load(self, key: bytes, layout: Layout) -> dict[str, mx.array]:
        """The arrays, after the layout check, then reading and authenticating the data."""
        version = self.metadata.get("format")
        if version != str(FORMAT_VERSION):
            raise ValueError(f"it was written by another version of mlx_agent (format "
                             f"{printable(str(version), 8)}, this one reads {FORMAT_VERSION})")
        layout.check(self.tensors)
        data = _read_exactly(self._fd, self._data_start, self.size - self._data_start)
        views = {n: memoryview(data)[t.data_offsets[0]:t.data_offsets[1]]
                 for n, t in self.tensors.items()}
        mac = _mac(key, self.metadata, {n: (t.dtype, t.shape) for n, t in self.tensors.items()},
                   views)
        if not hmac.compare_digest(self.metadata.get("mac", "").encode(), mac.encode()):
            raise ValueError("its checksum does not match: it was changed or damaged after it "
                             "was written, or written with another user's key")
        return {n: _array(views[n], t) for n, t in self.tensors.items()}


def write(path: str | os.PathLike, arrays: dict[str, mx.array], metadata: dict[str, str],
          key: bytes) -> int:
    """Write atomically, authenticated with ``key``; returns the file's size. Raises OSError
    when the directory refuses or the write fails (nothing is left of the file then)."""
    path = Path(path)
    arrays = {n: mx.contiguous(a) for n, a in arrays.items()}
    mx.eval(list(arrays.values()))
    meta = {**metadata, "format": str(FORMAT_VERSION)}
    shapes = {n: (_NAMES[a.dtype], tuple(a.shape)) for n, a in arrays.items()}
    meta["mac"] = _mac(key, meta, shapes, {n: memoryview(a) for n, a in arrays.items()})
    # MLX appends ".safetensors" to a name without it: the temporary name must end so
    with atomic_path(path, suffix=".tmp.safetensors") as tmp:
        try:
            mx.save_safetensors(str(tmp), arrays, meta)
        except RuntimeError as e:  # MLX's failed write (a full disk, a quota): no errno
            raise OSError(errno.EIO, f"{printable(str(e))} (is the disk full?)",
                          str(path)) from None
    return path.stat().st_size


def _mac(key: bytes, metadata: dict[str, str], shapes: dict, data: dict) -> str:
    """HMAC over the metadata (less the MAC), the tensors' names, dtypes and shapes, then
    their bytes in name order; the shapes fix each tensor's length, so nothing is ambiguous."""
    described = json.dumps({"metadata": {k: v for k, v in metadata.items() if k != "mac"},
                            "tensors": {n: [d, list(s)] for n, (d, s) in shapes.items()}},
                           sort_keys=True, separators=(",", ":")).encode()
    h = hmac.new(key, _MAC_DOMAIN + len(described).to_bytes(8, "little") + described, "sha256")
    for name in sorted(data):
        h.update(data[name])
    return h.hexdigest()


def _array(buf: memoryview, t: Tensor) -> mx.array:
    dtype, np_dtype = _DTYPES[t.dtype]
    a = mx.array(np.frombuffer(buf, dtype=np_dtype).reshape(t.shape))
    return a.view(dtype) if dtype == mx.bfloat16 else a


def _open_regular(path: Path, follow_symlinks: bool) -> int:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK) and not follow_symlinks and path.is_symlink():
            raise ValueError("it is a symbolic link, not a regular file") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ValueError(f"it is not a regular file ({kind_of(mode)})")
    return fd


def printable(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters, control characters shown as ``?``: names and
    messages that come from a file are shown to a terminal."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, in a word or two."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return name
    return "a special file"


def _read_header(fd: int, size: int) -> tuple[dict[str, str], dict[str, Tensor], int]:
    """(metadata, tensors, where the data starts), every offset checked against ``size``."""
    if size < 8:
        raise ValueError("it is too short to be a safetensors file")
    n = int.from_bytes(_read_exactly(fd, 0, 8), "little")
    if n > size - 8:
        raise ValueError(f"its header claims {n} bytes, the whole file holds {size}")
    if n > MAX_HEADER_BYTES:
        raise ValueError(f"its header claims {n} bytes, more than the {MAX_HEADER_BYTES} read")
    try:
        raw = msgspec.json.decode(_read_exactly(fd, 8, n), type=_RawHeader)
        metadata = raw.pop("__metadata__", {})
        if not all(isinstance(v, str) for v in metadata.values()):
            raise ValueError("its metadata holds a value that is not a string")
        tensors = {name: msgspec.convert(v, Tensor) for name, v in raw.items()}
    except msgspec.DecodeError as e:  # ValidationError is one too
        raise ValueError(f"its header is not a safetensors header ({printable(str(e))})") from None
    end = 0
    for name, t in sorted(tensors.items(), key=lambda item: item[1].data_offsets):
        if t.dtype not in _DTYPES:
            raise ValueError(f"its tensor {printable(name, 64)!r} has dtype "
                             f"{printable(t.dtype, 16)!r}, not one of {', '.join(_DTYPES)}")
        start, stop = t.data_offsets
        if start != end or stop - start != t.nbytes():
            raise ValueError(f"its tensor {printable(name, 64)!r} does not fit its offsets")
        end = stop
    if end != size - 8 - n:
        raise ValueError(f"its header declares {end} bytes of tensors, the file holds "
                         f"{size - 8 - n}")
    return metadata, tensors, 8 + n


def _read_exactly(fd: int, offset: int, n: int) -> bytearray:
    data = bytearray()
    while len(data) < n:  # pread may return less than asked; the file may have shrunk
        more = os.pread(fd, min(n - len(data), 1 << 30), offset + len(data))
        if not more:
            raise ValueError("it is shorter than its header says (truncated while read?)")
        data += more
    return data
