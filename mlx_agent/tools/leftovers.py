"""What a confined tool may not leave in a writable root for the host to run later.

A sandbox confines the tool while it runs; some files it writes act afterwards, outside it:

- **git repositories.** git runs programs named in a repository's config
  (``core.fsmonitor``, ``core.hooksPath``) and hooks whenever a user runs it there. A tool
  that creates one (a ``.git`` file or directory, or a git directory's layout: ``HEAD``
  beside ``objects/`` and ``refs/``, or beside a worktree's ``commondir``; see
  :func:`.rootfs.is_git_dir`) in a folder the user later works in runs code on the
  host. Existing ones are bound read-only for the call (:func:`scan` finds them); a new one
  is disarmed after it: its ``.git`` (or a bare one's ``HEAD``) renamed, nothing deleted.
- **setuid and setgid programs.** Files a tool writes are owned by the user the runtime
  runs as (root, in many containers); a set-user-id bit it sets lets any local user run them
  as that user. The bits are cleared after the call.
- **a root the tool locked.** ``chmod 000 .`` left the user's folder at mode 000 and every
  later call failed to start in it. :func:`root_modes` before a call and
  :func:`restore_roots` after it give each root back its owner's read, write and search bits.

:func:`scan` walks the writable roots before a call, :func:`clean` after it and undoes what
is new (repositories by inode, kind and link target, so a folder moved aside keeps its own
and a deleted ``.git`` link's inode number reused for a file is new), returning one line per
thing undone for the tool's result: about 0.1 s and 0.3 s for a tree of 43,000 entries here.
The walk (:func:`.rootfs.walk`) goes by directory descriptors (no path is too long, no depth
too deep, each level the same cost) and does not follow links; after a call it makes a
folder the tool left unreadable (mode 0311: git and programs still go through it by name)
readable to check it, where the folder changed during the call.

A root of more than :data:`MAX_ENTRIES` entries before a call is not walked to the end: it
is read-only for the call (fail closed), and the result says so. After a call the walk has
no limit: a root was at most that size before, and the rest the tool wrote in its own time
(an entry is walked faster than it is written). Not promised: between the tool's exit and
the clean-up (milliseconds) the files exist; a folder the runtime cannot read before a call
is read-only for it, and one it cannot read after (another user's) is named in the result,
not checked; a repository the runtime could not
disarm (not root, its folder not the runtime's) is said after every call, never bound as the
user's; other files that act later (a Makefile, a shell rc file, an editor's project
settings) are the user's to review, as with any code a tool writes. What was undone is said
in at most :data:`MAX_NOTES` lines and a count (a note's path shows its two ends), and a
repository nested past ``PATH_MAX`` makes its root read-only for the call (bwrap binds by
path).
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .rootfs import Here, is_git_dir, walk

MAX_ENTRIES = 50_000
DISARMED = ".disarmed-by-mlx-agent"
_SET_ID = stat.S_ISUID | stat.S_ISGID


MAX_NOTES = 20  # lines of what was undone kept for a tool's result; the rest are counted
PATH_MAX = 4096  # a repository deeper than this cannot be bound read-only by its path
_SHOWN = 200  # characters of a path a note shows from each end
_ARMED: set[tuple] = set()  # repositories a tool made that could not be disarmed: never known


def _shown(path: str) -> str:
    return path if len(path) <= 2 * _SHOWN else f"{path[:_SHOWN]}...{path[-_SHOWN:]}"


@dataclass
class Found:
    repositories: dict[str, tuple] = field(default_factory=dict)  # path: its _key
    notes: list[str] = field(default_factory=list)  # what was undone, or could not be
    more: int = 0  # notes past MAX_NOTES, counted, not written (a tool can make millions)
    # roots past MAX_ENTRIES before a call, or holding a repository too deep to bind: not
    # checked, so read-only for it (fail closed)
    too_big: list[str] = field(default_factory=list)
    # folders the check before a call could not read: read-only for it, so what is in them
    # after the call was there before (and is not the tool's to be undone)
    unreadable: list[str] = field(default_factory=list)

    def say(self, note: Callable[[], str]) -> None:
        """Keep ``note()`` (built only when kept: a path can be megabytes deep)."""
        if len(self.notes) < MAX_NOTES:
            self.notes.append(note())
        else:
            self.more += 1


    @property
    def read_only(self) -> list[str]:
        """What the sandbox binds read-only for the call: the repositories, the folders the
        check could not read, and the roots too big to check."""
        return [*self.repositories, *self.unreadable, *self.too_big]


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
        return True
    except OSError:
        return False


def _key(name: str, dir_fd: int) -> tuple:
    """What tells a repository's entry apart: its inode, its kind, and a link's target (a
    tool may delete a ``.git`` symlink, which the read-only bind does not hold, and get its
    inode number back for a file of its own)."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    target = os.readlink(name, dir_fd=dir_fd) if stat.S_ISLNK(st.st_mode) else None
    return st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode), target


def _free_name(name: str, dir_fd: int) -> str:
    n, candidate = 1, name
    while _exists(candidate, dir_fd):
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def scan(roots: Sequence[str], *, known: dict[str, tuple] | None = None,
         since: float | None = None, unreadable_before: Sequence[str] = ()) -> Found:
    """The git repositories under ``roots`` (each a ``.git`` entry, or a git directory's
    layout: :func:`.rootfs.is_git_dir`), by path and :func:`_key`. With ``known`` (what a
    scan found before a call that started at ``since``), also undo what the call left: a
    repository whose key is not known is disarmed (renamed: a moved folder keeps its
    repository), and a set-id bit on a file whose inode changed since ``since`` is cleared,
    in new repositories too. The walk holds directory descriptors, so depth is no limit."""
    found, after = Found(), known is not None
    old = set((known or {}).values())
    for root in roots:
        seen = 0

        def unreadable(where: str, e: OSError | None) -> None:
            if after:
                found.say(lambda: f"made {_shown(where)} readable to check it" if e is None
                          else f"could not check {_shown(where)}: {e.strerror}")
            elif len(where) > PATH_MAX:  # cannot be bound read-only: fail closed
                if root not in found.too_big:
                    found.too_big.append(root)
                    found.say(lambda: f"{_shown(root)} holds a folder this check cannot read, "
                                      "nested too deep to protect, so it was read-only for "
                                      "this call")
            else:
                found.unreadable.append(where)

        disarmed: set[tuple] = set()  # renamed .git directories: walked for set-id files only
        for here, dirs, files, fd in walk(root, unreadable, repair_since=since,
                                          keep=frozenset(unreadable_before)):
            seen += len(dirs) + len(files)
            inside = bool(disarmed) and _key(".", fd) in disarmed
            names = set() if inside else set(dirs) | set(files)
            for name, is_bare in ((".git", False), ("HEAD", True)):
                if name not in names or (is_bare and not is_git_dir(names)):
                    continue
                try:
                    key = _key(".", fd) if is_bare else _key(name, fd)
                except OSError:
                    continue
                if after and (key not in old or key in _ARMED):
                    renamed = _disarm(here, name, fd, dirs, found)
                    if renamed and not is_bare:
                        with contextlib.suppress(OSError):
                            disarmed.add(_key(renamed, fd))
                    elif renamed is None:
                        _ARMED.add(key)
                    continue
                if key in _ARMED:  # left armed by an earlier call: not the user's, not bound
                    continue
                if here.length + len(name) + 1 > PATH_MAX:  # bwrap cannot bind it
                    found.too_big.append(root)
                    found.say(lambda: f"{_shown(root)} holds a git repository nested too deep "
                                      "to protect, so it was read-only for this call")
                    break
                found.repositories[str(here) if is_bare else here.join(name)] = key
                if not is_bare and name in dirs:
                    dirs.remove(name)  # its contents are git's, and were there before
            if after:
                _clear_set_id(here, files, fd, since, found)
            # after a call the walk goes to the end: past the limit, what it walks the tool
            # wrote in its own time (a root too big before is read-only for the call)
            if root in found.too_big:
                break
            if seen > MAX_ENTRIES and not after:
                found.too_big.append(root)
                found.say(lambda: f"{root} holds more than {MAX_ENTRIES} entries, too many "
                                  "to check for git repositories and set-id files, so it was "
                                  "read-only for this call (give a smaller --root)")
                break
    return found


def _rename(name: str, new: str, fd: int) -> None:
    """Rename in ``fd``'s folder; a folder the tool made read-only (mode 0555: the
    runtime, not root, was refused) is given its owner's write bit back, and tried again."""
    try:
        os.rename(name, new, src_dir_fd=fd, dst_dir_fd=fd)
    except PermissionError:
        os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) | 0o700)
        os.rename(name, new, src_dir_fd=fd, dst_dir_fd=fd)


def _disarm(here: Here, name: str, fd: int, dirs: list[str], found: Found) -> str | None:
    """Rename a new repository's ``.git`` (or a bare one's ``HEAD``), and the ``HEAD`` inside
    a ``.git`` folder (else the renamed folder is a bare repository still): not deleted,
    since what the tool moved there may be the user's files. Returns the new name."""
    new = _free_name(name + DISARMED, fd)
    try:
        _rename(name, new, fd)
    except OSError as e:
        found.say(lambda: f"could not rename {_shown(here.join(name))}, from a git repository "
                          f"the tool made: {e.strerror}; delete it before running git there")
        return None
    if name in dirs:  # still walked, under its new name: set-id files may hide inside
        dirs[dirs.index(name)] = new
        with contextlib.suppress(OSError):
            inner = os.open(new, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            try:
                if _exists("HEAD", inner):
                    _rename("HEAD", _free_name("HEAD" + DISARMED, inner), inner)
            finally:
                os.close(inner)
    found.say(lambda: f"renamed {_shown(here.join(name))} to {new}: the tool made a git "
                      "repository, whose config git would run outside the sandbox")
    return new


def _clear_set_id(here: Here, files: list[str], fd: int, since: float | None,
                  found: Found) -> None:
    for name in files:
        try:
            st = os.lstat(name, dir_fd=fd)
        except OSError:
            continue
        if not (stat.S_ISREG(st.st_mode) and st.st_mode & _SET_ID and st.st_ctime >= since):
            continue
        def path(name: str = name) -> str:
            return here.join(name)

        try:  # by descriptor: a symlink swapped in now cannot redirect the chmod
            file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        except OSError as e:
            found.say(lambda: f"could not clear the set-id bit of {_shown(path())}: "
                              f"{e.strerror}")
            continue
        try:
            now = os.fstat(file_fd)
            if stat.S_ISREG(now.st_mode) and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                os.fchmod(file_fd, stat.S_IMODE(now.st_mode) & ~_SET_ID)
                found.say(lambda: f"cleared the set-user/group-id bit of {_shown(path())}")
        finally:
            os.close(file_fd)


def root_modes(roots: Sequence[str]) -> dict[str, int]:
    """Each root's mode before a call (a root that cannot be read is left out)."""
    modes = {}
    for root in roots:
        with contextlib.suppress(OSError):
            modes[root] = os.stat(root).st_mode
    return modes


def restore_roots(modes: dict[str, int]) -> list[str]:
    """Give each root back the owner bits (``rwx``) it had before the call, and a note for
    each given back. Never raises. A root is a bind mount whose own entry the tool cannot
    replace (its folder is read-only), so the path is still the root."""
    notes = []
    for root, before in modes.items():
        try:
            st = os.stat(root)
            lost = before & 0o700 & ~st.st_mode
            if not lost or not stat.S_ISDIR(st.st_mode):
                continue
            os.chmod(root, stat.S_IMODE(st.st_mode) | lost)
            notes.append(f"gave {_shown(root)} back its owner's permissions (the tool had left "
                         f"it at mode {stat.S_IMODE(st.st_mode):04o})")
        except OSError as e:
            notes.append(f"could not give {_shown(root)} back its owner's permissions: "
                         f"{e.strerror}")
    return notes


def clean(roots: Sequence[str], before: Found, since: float) -> Found:
    """Undo what a call that started at ``since`` (``time.time()``) left, as :func:`scan`
    does with ``before``; its notes say what, for the tool's result. Never raises: a check
    that cannot finish says so."""
    roots = [r for r in roots if r not in before.too_big]  # read-only: nothing was left
    try:
        return scan(roots, known=before.repositories, since=since - 1.0,  # coarse clocks
                    unreadable_before=before.unreadable)
    except (OSError, RecursionError, MemoryError) as e:
        return Found(notes=[f"could not finish checking {', '.join(roots)} for git "
                            f"repositories and set-id files the tool left "
                            f"({type(e).__name__}: {e}); check before running git or "
                            "programs there"])
