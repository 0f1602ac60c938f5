"""File work confined to one directory, safe against symlink swaps; and the built-in grep.

Every path is walked a component at a time from the root's directory descriptor: each
directory is opened with ``O_NOFOLLOW`` relative to its parent (``openat``), so swapping a
directory for a symlink mid-call cannot lead outside. Symlinks are followed by hand: the
target is read (``readlinkat``) and walked the same way, and a walk that leaves the root
(``..`` above it, an absolute path elsewhere, a link out) raises :class:`OutsideRoot`.
Files are opened with ``O_NOFOLLOW | O_NONBLOCK`` and must be regular (a FIFO or device is
refused, not waited on). Writes go to a temporary file in the held directory, renamed over the
name (``renameat`` never follows a link at the destination) and removed if anything fails;
none goes into a git directory, by any name (:func:`is_git_dir`), or completes one.

:func:`walk` lists a tree by directory descriptors too, without recursion and at the same
cost a level however deep (``list_files``, ``grep``, and the sandbox's checks of what a tool
left, :mod:`.leftovers`).

This module imports only the standard library: the built-in ``grep`` runs it as a script
(``python -I rootfs.py '<json>'``) in a child process that the tool timeout can kill, since a
backtracking regular expression cannot be interrupted in-process.

Not promised: a directory renamed out of the root while a call holds it is not noticed; a
hard link in the root to a file elsewhere is a file in the root; writes are atomic but not
fsynced. Linux and macOS.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import json
import os
import re
import secrets
import stat
import sys
from collections import deque
from typing import Callable, Iterator

SKIP_DIRS = frozenset({".git", "__pycache__", ".venv", "node_modules", ".pytest_cache"})
WRITE_PROTECTED = frozenset({".git"})  # lower case: a case-insensitive filesystem matches .GIT
MAX_LINE = 64 * 1024  # grep searches (and shows) this much of a line
GREP_MAX_FILE = 256 << 20  # grep skips (and names) files larger than this
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_IS_LINK = {errno.ELOOP, errno.ENOTDIR, errno.EMLINK}  # what O_NOFOLLOW meets on a link
_MAX_HOPS = 40


class OutsideRoot(ValueError):
    pass


GIT_DIR_PARTS = ("HEAD", "objects", "refs", "commondir")  # each of any kind: a HEAD symlink
# and executable files count too


def is_git_dir(names: set[str]) -> bool:
    """Whether git takes a directory holding ``names`` for a git directory (one whose config
    and hooks it runs): ``HEAD`` beside ``objects`` and ``refs`` (a bare repository, or one a
    ``.git`` file points to), or beside ``commondir`` (a linked worktree's, whose objects and
    config are elsewhere)."""
    return "HEAD" in names and ({"objects", "refs"} <= names or "commondir" in names)


def _git_parts(dir_fd: int) -> set[str]:
    present = set()
    for name in GIT_DIR_PARTS:
        with contextlib.suppress(OSError):
            os.lstat(name, dir_fd=dir_fd)
            present.add(name)
    return present


def _completes_repository(dir_fd: int, part: str) -> bool:
    """Whether writing ``part`` (the file, or a directory on the way) in the directory
    ``dir_fd`` makes it a git directory (:func:`is_git_dir`)."""
    names = {n.lower(): n for n in GIT_DIR_PARTS}
    if part not in names:
        return False
    present = _git_parts(dir_fd)
    return not is_git_dir(present) and is_git_dir(present | {names[part]})


def _parts(root: str, path: str) -> list[str]:
    if "\0" in path:
        raise ValueError(f"the path {path!r} contains a NUL character")
    if path.startswith("/"):
        if path != root and not path.startswith(root.rstrip("/") + "/"):
            raise OutsideRoot()
        path = path[len(root):]
    return [p for p in path.split("/") if p not in ("", ".")]


def _readlink(dir_fd: int, name: str) -> str | None:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENOENT):  # not a link, or not there
            return None
        raise


class _Walk:
    """The open directories from the root down to where a walk stands, with their names."""

    def __init__(self, root: str, protected: frozenset = frozenset()):
        self.root = root
        self.fds = [os.open(root, _DIR)]
        self.names: list[str] = []
        self.hops = 0  # links followed and directories made: bounded, whatever races
        self.protected = protected  # (st_dev, st_ino) of folders a write may not enter

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    @property
    def fd(self) -> int:
        return self.fds[-1]

    def relative(self, name: str | None = None) -> str:
        return "/".join([*self.names, *([name] if name else [])]) or "."

    def _hop(self) -> None:
        self.hops += 1
        if self.hops > _MAX_HOPS:
            raise OSError(errno.ELOOP, "too many levels of symbolic links")

    def _follow(self, target: str, todo: deque) -> None:
        self._hop()
        if target.startswith("/"):
            while len(self.fds) > 1:
                self.up()
        todo.extendleft(reversed(_parts(self.root, target)))

    def up(self) -> None:
        if len(self.fds) == 1:
            raise OutsideRoot()
        os.close(self.fds.pop())
        self.names.pop()

    def down(self, parts: list[str], create: bool = False) -> str | None:
        """Walk ``parts``; the last one is returned (not opened) unless it is ``..`` or a
        symlink, which are followed. ``create`` (a walk to write) makes missing directories
        on the way and refuses every name in :data:`WRITE_PROTECTED`, however it is reached
        (a symlink's target is walked name by name too)."""
        todo = deque(parts)
        if create:
            self._refuse_git_dir()
            self._refuse_protected()
        while todo:
            part = todo.popleft()
            if part == "..":
                self.up()
                continue
            if create and part.lower() in WRITE_PROTECTED:
                raise PermissionError(f"the path leads inside a {part} directory, which "
                                      "tools may not write (git runs its config and hooks "
                                      "later, outside any sandbox)")
            if create and _completes_repository(self.fd, part.lower()):
                raise PermissionError("the write would make a directory a git repository "
                                      "(HEAD beside objects/ and refs/, or beside commondir), "
                                      "whose config git runs later, outside any sandbox")
            if not todo:
                target = _readlink(self.fd, part)
                if target is None:
                    return part
                self._follow(target, todo)
                continue
            try:
                fd = os.open(part, _DIR, dir_fd=self.fd)
            except FileNotFoundError:
                if not create:
                    raise
                self._hop()
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=self.fd)
                todo.appendleft(part)
                continue
            except OSError as e:
                target = _readlink(self.fd, part) if e.errno in _IS_LINK else None
                if target is None:
                    raise
                self._follow(target, todo)
                continue
            self.fds.append(fd)
            self.names.append(part)
            if create:
                self._refuse_git_dir()
                self._refuse_protected()
        return None

    def _refuse_protected(self) -> None:
        """A write may not go into a protected folder (this runtime's own code: a ``.pth``
        file planted in a virtual environment runs, unconfined, at the next start)."""
        st = os.fstat(self.fd)
        if (st.st_dev, st.st_ino) in self.protected:
            raise PermissionError(f"{self.relative()!r} holds this runtime's own code (its "
                                  "Python environment or package), which tools may not write")

    def _refuse_git_dir(self) -> None:
        """A write may not go into (or through) a git directory by any name: a bare
        repository, the one a ``.git`` file points to, a worktree's."""
        if is_git_dir(_git_parts(self.fd)):
            raise PermissionError(f"{self.relative()!r} is a git directory (HEAD beside "
                                  "objects/ and refs/, or commondir), which tools may not "
                                  "write: git runs its config and hooks later, outside any "
                                  "sandbox")


@contextlib.contextmanager
def located(root: str, path: str, create: bool = False, protected: frozenset = frozenset()
            ) -> Iterator[tuple[_Walk, str | None]]:
    """The walk to ``path``'s parent directory and its last name (None: a directory);
    ``create`` (a walk to write) refuses the folders in ``protected`` too."""
    walk = _Walk(root, protected)
    try:
        try:
            name = walk.down(_parts(root, path or "."), create=create)
        except OutsideRoot:
            raise OutsideRoot(f"{path!r} is outside the tool root") from None
        except FileNotFoundError:
            raise FileNotFoundError(f"no file or directory {path!r}") from None
        except NotADirectoryError:
            raise NotADirectoryError(f"{path!r} goes through a file, not a directory") from None
        yield walk, name
    finally:
        walk.close()


def open_regular(dir_fd: int, name: str, path: str) -> int:
    """A descriptor for the regular file ``name`` in ``dir_fd``; ``path`` names it in errors."""
    try:
        fd = os.open(name, _FILE, dir_fd=dir_fd)
    except FileNotFoundError:
        raise FileNotFoundError(f"no file {path!r}") from None
    except OSError as e:
        if e.errno in _IS_LINK:  # swapped for a link since we looked: refuse, don't follow
            raise OutsideRoot(f"{path!r} changed while it was opened; try again") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(f"{path!r} is a directory")
        raise OSError(f"{path!r} is not a regular file")
    return fd


def open_in_root(root: str, path: str) -> int:
    """A descriptor of the regular file at ``path`` inside ``root``; the caller closes it."""
    with located(root, path) as (walk, name):
        if name is None:
            raise IsADirectoryError(f"{path!r} is a directory")
        return open_regular(walk.fd, name, path)


def files(root: str, path: str = ".") -> Iterator[tuple[str, int]]:
    """(relative path, descriptor) of each regular file at or under ``path``, sorted, skipping
    :data:`SKIP_DIRS`; each descriptor is closed when the next file is asked for."""
    with located(root, path) as (walk, name):
        try:
            start = os.open(name, _FILE, dir_fd=walk.fd) if name else os.dup(walk.fd)
        except FileNotFoundError:
            raise FileNotFoundError(f"no file or directory {path!r}") from None
        prefix = walk.relative(name)
    try:
        if stat.S_ISDIR(os.fstat(start).st_mode):
            entries = _tree(prefix, start)
        else:
            entries = iter([(prefix, None, None)])
        for rel, dir_fd, name in entries:
            fd = _open_entry(root, rel, dir_fd, name)
            if fd is None:
                continue
            try:
                yield rel, fd
            finally:
                os.close(fd)
    finally:
        os.close(start)


def near(root: str, path: str, most: int = 3, scanned: int = 5_000) -> list[str]:
    """Up to ``most`` paths under ``root`` that a missing ``path`` may mean, for a not-found
    error's "did you mean": the files and folders named as its last part (case aside, or
    without an extension: "users" for "data/users.csv"), but ``path`` itself (a link that
    leads nowhere) and links, of the first ``scanned`` names of the walk, sorted; none for a
    name of no letter or digit. Nothing is opened but folders, and links are not followed.
    Not promised: a folder's names are all listed before the count is checked (one folder of
    a million files is read whole)."""
    want = os.path.basename(os.path.normpath(path.strip())).lower() if path.strip() else ""
    if not any(c.isalnum() for c in want):
        return []
    asked = os.path.normpath(path.strip().lstrip("/"))
    found, left = [], scanned
    try:
        for here, dirnames, filenames, fd in walk(root, top="."):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            names = (dirnames + filenames)[:left]
            left -= len(names)
            for name in names:
                rel = os.path.normpath(os.path.join(str(here), name))
                if (name.lower() == want or name.lower().rsplit(".", 1)[0] == want) \
                        and rel != asked and not _is_link(fd, name):
                    found.append(rel)
            if not left or len(found) >= most:
                break
    except OSError:
        pass
    return sorted(found)[:most]


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return True  # gone: nothing to suggest


class Here:
    """A directory the walk stands in, as a link to its parent: the path is joined only when
    a message or a bind needs it (joining it at every level made a deep tree of long names
    cost its depth times its path's length)."""

    __slots__ = ("parent", "name", "length")

    def __init__(self, parent: Here | None, name: str):
        self.parent, self.name = parent, name
        self.length = len(name) + (parent.length + 1 if parent is not None else 0)  # str's

    def __str__(self) -> str:
        names, node = [], self
        while node is not None:
            names.append(node.name)
            node = node.parent
        return os.path.join(*reversed(names))

    def join(self, name: str) -> str:
        return os.path.join(str(self), name)


def _changed(name: str, dir_fd: int, since: float) -> bool:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_ctime >= since
    except OSError:
        return False


def _readable(name: str, dir_fd: int) -> bool:
    """Make the directory ``name`` readable and searchable by its owner (the runtime's user:
    a tool's folders are), through a descriptor that a swapped-in link cannot redirect; False
    where that cannot be done (another user's folder, or no ``/proc``)."""
    o_path = getattr(os, "O_PATH", 0)
    if not o_path or not os.path.isdir("/proc/self/fd"):
        return False
    try:
        fd = os.open(name, o_path | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:
        return False
    try:
        os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(os.fstat(fd).st_mode) | 0o500)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def walk(root: str | int, unreadable: Callable[[str, OSError | None], None] = lambda w, e: None,
         repair_since: float | None = None, top: str | None = None,
         keep: frozenset[str] = frozenset()
         ) -> Iterator[tuple[Here, list[str], list[str], int]]:
    """``os.fwalk``'s top-down ``(where, dirs, files, dir_fd)`` without its recursion
    (Python 3.11's recurses once a level: a thousand nested folders raised RecursionError)
    and with one descriptor, moved down by name and back up by ``..``: no depth is too deep,
    and each level costs the same. ``dirs`` may be edited before the walk goes on; links are
    not followed. A folder that cannot be opened is passed to ``unreadable`` with the error;
    one changed since ``repair_since`` (``time.time()``; a tool's, or one a tool changed) is
    first made readable (see :func:`_readable`) and tried again (then ``unreadable`` gets
    None): a tool's folder with its read bit off (mode 0311) is still one git and programs
    go through by name. A folder named in ``keep`` (unreadable before) is left as it was."""
    # root: a path, or a directory descriptor (not closed; ``top`` names it in paths)
    fd = os.dup(root) if isinstance(root, int) else os.open(root, _DIR)
    here, todo = Here(None, top or str(root)), []  # todo: per level, the folders to visit
    try:
        while True:
            dirs, files = [], []
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        try:
                            (dirs if entry.is_dir(follow_symlinks=False) else files).append(
                                entry.name)
                        except OSError:
                            files.append(entry.name)
            except OSError as e:
                unreadable(str(here), e)
            yield here, dirs, files, fd
            todo.append(dirs[::-1])
            while True:
                if todo[-1]:
                    name = todo[-1].pop()
                    try:
                        child = os.open(name, _DIR, dir_fd=fd)
                    except PermissionError as e:
                        if not (repair_since is not None and _changed(name, fd, repair_since)
                                and here.join(name) not in keep and _readable(name, fd)):
                            unreadable(here.join(name), e)
                            continue
                        try:
                            child = os.open(name, _DIR, dir_fd=fd)
                        except OSError as e:
                            unreadable(here.join(name), e)
                            continue
                        unreadable(here.join(name), None)
                    except OSError as e:
                        unreadable(here.join(name), e)
                        continue
                    os.close(fd)
                    fd, here = child, Here(here, name)
                    break
                todo.pop()
                if not todo:
                    return
                parent = os.open("..", _DIR, dir_fd=fd)
                os.close(fd)
                fd, here = parent, here.parent
    finally:
        os.close(fd)


def _tree(prefix: str, start: int):
    # descends only into real directories (opened with O_NOFOLLOW), at any depth
    for here, dirnames, filenames, dir_fd in walk(start, top="."):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            yield os.path.normpath(os.path.join(prefix, str(here), name)), dir_fd, name


def _open_entry(root: str, rel: str, dir_fd: int | None, name: str | None) -> int | None:
    """A regular file's descriptor, or None for anything else (a link out, a FIFO, gone)."""
    try:
        if dir_fd is not None:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
            if stat.S_ISREG(mode):
                return open_regular(dir_fd, name, rel)
            if not stat.S_ISLNK(mode):
                return None
        return open_in_root(root, rel)  # a link, or the start itself: the careful walk
    except (OSError, ValueError):
        return None


def write_atomic(root: str, path: str, data: bytes, protected: frozenset = frozenset()) -> str:
    """Replace (or create) the file at ``path`` with ``data``, in no folder of ``protected``
    (``(st_dev, st_ino)`` pairs, whatever names reach them); its relative path."""
    with located(root, path, create=True, protected=protected) as (walk, name):
        if name is None:
            raise IsADirectoryError(f"{path!r} is a directory")
        try:
            old = os.stat(name, dir_fd=walk.fd, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise IsADirectoryError(f"{path!r} is a directory")
        tmp = f".{name}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o666, dir_fd=walk.fd)  # 0666 less the umask, as any new file
        try:
            try:
                if old is not None and stat.S_ISREG(old.st_mode):
                    # not its set-id bits: they would make the model's content a program
                    # that runs as the file's owner
                    os.fchmod(fd, stat.S_IMODE(old.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=walk.fd, dst_dir_fd=walk.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=walk.fd)
            raise
        return walk.relative(name)


# -- grep, run as a child process --------------------------------------------------------

def _lines(fd: int) -> Iterator[str]:
    """The lines of a UTF-8 file as ``str.splitlines`` cuts them, each at most
    :data:`MAX_LINE` bytes; raises UnicodeDecodeError as a whole-file read would."""
    with open(fd, "rb", closefd=False) as f:
        while raw := f.readline(MAX_LINE):
            decoder = codecs.getincrementaldecoder("utf-8")()
            whole = raw.endswith(b"\n") or len(raw) < MAX_LINE
            text = decoder.decode(raw, final=whole)
            if not whole:  # the rest of a long line is skipped, not searched
                while (more := f.readline(MAX_LINE)) and not more.endswith(b"\n"):
                    pass
            yield from text.splitlines() or [""]


def grep(root: str, pattern: str, path: str, max_matches: int) -> Iterator[str]:
    """The output's lines, a file's matches at a time (so a timeout keeps what was found):
    ``path:line: text``, then a note for files over :data:`GREP_MAX_FILE` bytes, which are
    skipped (one such file could take the whole timeout and hide every file after it). A
    pattern with no capital letter (its escapes such as ``\\S`` aside) matches in any case,
    as ripgrep's ``--smart-case`` does: "flour" finds "Flour"."""
    regex = re.compile(pattern, 0 if _has_capital(pattern) else re.IGNORECASE)
    hits, big = 0, []
    for rel, fd in files(root, path):
        if os.fstat(fd).st_size > GREP_MAX_FILE:
            big.append(rel)
            continue
        try:
            found = [f"{rel}:{i}: {line}" for i, line in enumerate(_lines(fd), 1)
                     if regex.search(line)]
        except (UnicodeDecodeError, OSError):  # not text: skipped, as a whole
            continue
        yield from found[:max_matches - hits]
        hits += len(found)
        if hits >= max_matches:
            yield "…[more matches]"
            return
    if not hits:
        yield "no matches"
    if big:
        shown = ", ".join(big[:5]) + (f" and {len(big) - 5} more" if len(big) > 5 else "")
        yield f"(not searched, over {GREP_MAX_FILE >> 20} MB: {shown})"


def _has_capital(pattern: str) -> bool:
    """Whether a regular expression writes a capital letter, not in an escape (``\\S``)."""
    return any(c.isupper() for c in re.sub(r"\\.", "", pattern))


def _main(argv: list[str]) -> int:
    sys.stdout.reconfigure(encoding="utf-8", errors="surrogateescape")
    sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace")
    job = json.loads(argv[1])
    try:
        re.compile(job["pattern"])
    except re.error as e:
        print(f"error: bad regular expression: {e}", file=sys.stderr)
        return 1
    try:
        lines = grep(job["root"], job["pattern"], job["path"], job["max_matches"])
        for i, line in enumerate(lines):
            print(("\n" if i else "") + line, end="", flush=True)
    except Exception as e:  # reported like any built-in's failure
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
