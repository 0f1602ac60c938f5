"""Atomic file writes: a temporary file in the target's directory, fsync, then rename.

A reader (or a crash) sees the old file or the new one, never half of one. Not promised:
durability of the directory entry itself (no fsync of the directory).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yields a temporary path to write; on success it is synced and renamed to ``path``,
    on failure removed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent or ".")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_jsonl(path: str | os.PathLike, rows) -> None:
    import json

    write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
