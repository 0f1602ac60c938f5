"""Atomic file writes, and reads that only read regular files.

A write goes to a temporary file in the target's directory, then fsync, then rename: a reader
(or a crashed process) sees the old file or the new one, never half of one; with ``durable``
(the default) the data is also on disk before the rename, so a crashed machine does too. New
files get the usual permissions (0666 less the umask), not mkstemp's 0600. Not promised:
durability of the directory entry itself (no fsync of the directory).

:func:`read_regular` reads a file a user names (tools, tasks, trajectories) and refuses
anything but a regular file: a FIFO would block the reader forever, a device never end; and,
given a cap, a file larger than it, before reading any of it.
:func:`copy_tree` copies a folder a user names (an eval task's fixture) on the same terms:
files, folders and links only (a device node in a fixture was copied until the disk filled).
:class:`PinnedFolder` is an output folder named at the start of a run that tools may reach
(the agent's ``--trajectory-dir`` inside its ``--root``): each write first checks it is still
the folder it was, so a tool that swapped it for a link elsewhere cannot redirect the write.
:func:`jsonl_lines` cuts a JSONL file's text at newlines only, as its writers mean them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

from .errors import UserFacingError


def _read_umask() -> int:
    mask = os.umask(0)  # the only way to read it; done once, at import, before any threads
    os.umask(mask)
    return mask


_UMASK = _read_umask()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp",
                durable: bool = True) -> Iterator[Path]:
    """Yields a temporary path to write; on success it is synced (``durable``) and renamed
    to ``path``, on failure removed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent or ".")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def temp_dir_beside(path: str | os.PathLike) -> Path:
    """A new, empty directory beside ``path`` (to fill, then rename to ``path``), with the
    usual permissions (0777 less the umask), not mkdtemp's 0700."""
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_UMASK)
    return tmp


def cannot_create(e: OSError, path: str | os.PathLike) -> str:
    """Why creating ``path`` (or something in it) failed, in words that help: ENOENT under a
    folder that exists is a filesystem that takes no new entries (``/proc``, ``/sys``), not
    a missing folder, which is what its strerror says."""
    if e.errno == errno.ENOENT:
        here = Path(os.path.abspath(path))
        existing = next((p for p in (here, *here.parents) if p.exists()), None)
        if existing is not None and existing.is_dir() and existing != here:
            return f"{existing} takes no new files or folders"
    return e.strerror or str(e)


def write_bytes(path: str | os.PathLike, data: bytes, durable: bool = True) -> None:
    with atomic_path(path, durable=durable) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Write ``rows`` atomically, a line each, consuming them as they are written (a
    generator's rows are never all in memory). An exception from the iterable leaves
    ``path`` as it was."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def read_regular(path: str | os.PathLike, limit: int = -1,
                 max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file at ``path`` (links followed; the first ``limit`` only,
    if given). Anything else (a FIFO, a device, a directory) is an OSError whose
    ``strerror`` says so, raised without waiting: the file is opened non-blocking and
    checked before it is read. So is a file of more than ``max_bytes``, if given, before
    any of it is read (a 3 GB tools file was read whole to find its JSON invalid)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        regular = stat.S_ISREG(st.st_mode)
        if regular:
            os.set_blocking(fd, True)
    except OSError:
        os.close(fd)
        raise
    if not regular:
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    if max_bytes is not None and st.st_size > max_bytes:
        os.close(fd)
        raise _too_large(path, st.st_size, max_bytes)
    with open(fd, "rb") as f:  # the file object owns fd from here
        if max_bytes is None:
            return f.read(limit)
        data = f.read(max_bytes + 1 if limit < 0 else min(limit, max_bytes + 1))
    if len(data) > max_bytes:  # it grew after the check
        raise _too_large(path, len(data), max_bytes)
    return data


def _too_large(path, size: int, max_bytes: int) -> OSError:
    limit = f"{max_bytes >> 20} MiB" if max_bytes % (1 << 20) == 0 else f"{max_bytes:,}-byte"
    return OSError(errno.EFBIG, f"it is {size:,} bytes, over the {limit} limit", str(path))


def jsonl_lines(text: str) -> list[str]:
    """The lines of a JSONL file's text, cut at "\\n" only (a "\\r" before it dropped, a
    byte-order mark at the start too). ``str.splitlines`` also cuts at U+2028, U+0085, \\x1c
    and the like, which :func:`write_jsonl` leaves raw inside JSON strings."""
    return [line.removesuffix("\r") for line in text.removeprefix("\ufeff").split("\n")]


MAX_TREE_ENTRIES = 100_000


def check_tree(path: str | os.PathLike, max_entries: int = MAX_TREE_ENTRIES) -> None:
    """Raises OSError (``strerror`` saying why) unless the folder ``path`` holds only
    regular files, folders and symbolic links (not followed), at most ``max_entries``."""
    todo, seen = [Path(path)], 0
    while todo:
        with os.scandir(todo.pop()) as entries:
            for entry in entries:
                seen += 1
                if seen > max_entries:
                    raise OSError(errno.EFBIG, f"more than {max_entries:,} entries", str(path))
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    todo.append(Path(entry.path))
                elif not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                    raise OSError(errno.EINVAL, "not a regular file, folder or link",
                                  entry.path)


def copy_tree(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """``src`` copied to ``dst`` (links as links) after :func:`check_tree`; a file swapped
    for anything else meanwhile is refused too. Raises OSError."""
    check_tree(src)

    def copy_regular(a: str, b: str) -> None:
        if not stat.S_ISREG(os.lstat(a).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", a)
        shutil.copy2(a, b)

    try:
        shutil.copytree(src, dst, symlinks=True, copy_function=copy_regular)
    except shutil.Error as e:  # the first of the errors it gathered
        src_name, _, why = e.args[0][0]
        raise OSError(errno.EINVAL, why, src_name) from None


class FolderReplaced(UserFacingError):
    """An output folder is no longer the folder it was when the run began."""


class PinnedFolder:
    """A folder as it was when the run began (created if missing): :meth:`check` raises
    :class:`FolderReplaced` when the path now leads elsewhere (it, or a folder above it,
    was replaced by a link or another folder). Writes happen between tool calls, so a check
    just before a write sees what a tool left. Not promised: protection from a process
    racing the write itself (the sandbox ends a call's processes with the call, but a stdio
    MCP server runs for the whole session)."""

    def __init__(self, path: str | os.PathLike, what: str):
        Path(path).mkdir(parents=True, exist_ok=True)
        self.path, self.what = Path(os.path.realpath(path)), what
        self._key = self._identity()

    def _identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None

    def check(self) -> Path:
        """The folder's path, after checking it is the same folder and reached without links."""
        if os.path.realpath(self.path) != str(self.path) or self._identity() != self._key:
            raise FolderReplaced(f"{self.what} {self.path} was replaced or moved during the run "
                                 "(by a tool?); nothing more is written there: keep it outside "
                                 "the tools' --root")
        return self.path
