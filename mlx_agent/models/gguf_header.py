"""A GGUF file's header, checked against the file before MLX's native reader sees it.

``mx.load`` (gguflib) trusts the header: a tensor count of 2^63 or a key length of 2^62
crashed the process (a segfault), and a tensor of 1,000 dimensions failed an assertion (an
abort). :func:`check` walks the header the way the reader will, with every count and length
bounded by the bytes left in the file, and raises :class:`HeaderError` with one line.

Not promised: that the tensors' data is sensible (their values are the reader's and the
model's business), or any check of GGUF versions other than 2 and 3.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

MAX_DIMS = 4  # GGUF_TENSOR_MAX_DIM
_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # type: size
_STRING, _ARRAY = 8, 9
# bytes per block of 32 for the types the reader takes (F32 and F16 per element)
_BLOCK = {0: (4, 1), 1: (2, 1), 2: (18, 32), 3: (20, 32), 8: (34, 32)}


class HeaderError(ValueError):
    """A GGUF header that does not fit its file; the message says where."""


class _Reader:
    def __init__(self, data: memoryview):
        self.data, self.pos = data, 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or n > len(self.data) - self.pos:
            raise HeaderError(f"{what} needs {n} bytes at offset {self.pos}, past the end of "
                              f"the {len(self.data)}-byte file")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def string(self, what: str) -> str:
        return bytes(self.take(self.u64(f"{what}'s length"), what)).decode("utf-8", "replace")

    def value(self, kind: int, what: str, depth: int = 0) -> None:
        if kind in _SCALARS:
            self.take(_SCALARS[kind], what)
        elif kind == _STRING:
            self.string(what)
        elif kind == _ARRAY and depth < 2:
            inner, count = self.u32(f"{what}'s element type"), self.u64(f"{what}'s length")
            if inner in _SCALARS:
                self.take(count * _SCALARS[inner], what)
            elif count > len(self.data) - self.pos:  # each element takes a byte at least
                raise HeaderError(f"{what} claims {count} elements, more than the file holds")
            elif inner == _STRING:  # a vocabulary: 49,152 strings, skipped by their lengths
                pos, end = self.pos, len(self.data)
                for _ in range(count):
                    if pos + 8 > end or (pos := pos + 8 + struct.unpack_from(
                            "<Q", self.data, pos)[0]) > end:
                        raise HeaderError(f"{what} runs past the end of the {end}-byte file")
                self.pos = pos
            else:
                for _ in range(count):
                    self.value(inner, what, depth + 1)
        else:
            raise HeaderError(f"{what} has an unknown value type {kind}")


def check(path: str | Path) -> None:
    """Raises HeaderError unless ``path``'s GGUF header fits the file."""
    with open(path, "rb") as f:
        if not f.seek(0, 2):
            raise HeaderError("the file is empty")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    with mm:
        data = memoryview(mm)
        try:
            _check(_Reader(data))
        finally:
            data.release()


def _check(r: _Reader) -> None:
    if bytes(r.take(4, "the magic")) != b"GGUF":
        raise HeaderError("the file does not start with GGUF")
    version = r.u32("the version")
    if version not in (2, 3):
        raise HeaderError(f"GGUF version {version} is not supported (2 or 3)")
    tensors, keys = r.u64("the tensor count"), r.u64("the key count")
    size = len(r.data)
    if tensors > size // 24 or keys > size // 12:  # the smallest entries there can be
        raise HeaderError(f"the header claims {tensors} tensors and {keys} keys, more than "
                          f"a {size}-byte file holds")
    alignment = 32
    for i in range(keys):
        key = r.string(f"key {i}")
        kind = r.u32(f"key {key!r}'s type")
        if key == "general.alignment" and kind == 4:
            alignment = r.u32("general.alignment")
            if alignment <= 0 or alignment & (alignment - 1):  # 0 divided by zero natively
                raise HeaderError(f"general.alignment is {alignment}, not a power of two")
        else:
            r.value(kind, f"key {key!r}")
    infos = []
    for i in range(tensors):
        name = r.string(f"tensor {i}'s name")
        dims = r.u32(f"tensor {name!r}'s dimension count")
        if not 1 <= dims <= MAX_DIMS:
            raise HeaderError(f"tensor {name!r} has {dims} dimensions (at most {MAX_DIMS})")
        shape = [r.u64(f"tensor {name!r}'s shape") for _ in range(dims)]
        kind, offset = r.u32(f"tensor {name!r}'s type"), r.u64(f"tensor {name!r}'s offset")
        infos.append((name, shape, kind, offset))
    start = -(-r.pos // alignment) * alignment
    for name, shape, kind, offset in infos:
        elements = 1
        for n in shape:
            elements *= n
        if kind not in _BLOCK:
            continue  # the reader says it does not take this type, in a line of its own
        nbytes, per = _BLOCK[kind]
        if start + offset + -(-elements // per) * nbytes > size:
            raise HeaderError(f"tensor {name!r} ({'x'.join(map(str, shape))}) runs past the "
                              f"end of the {size}-byte file")
