"""What a confined tool may not leave in a writable root for the host to run later.

A sandbox confines the tool while it runs; some files it writes act afterwards, outside it:

- **git repositories.** git runs programs named in a repository's config
  (``core.fsmonitor``, ``core.hooksPath``) and hooks whenever a user runs it there. A tool
  that creates one (a ``.git`` file or directory, or a bare repository's layout: ``HEAD``
  beside ``objects/`` and ``refs/``) in a folder the user later works in runs code on the
  host. Existing ones are bound read-only for the call (:func:`scan` finds them); a new one
  is disarmed after it: its ``.git`` (or a bare one's ``HEAD``) renamed, nothing deleted.
- **setuid and setgid programs.** Files a tool writes are owned by the user the runtime
  runs as (root, in many containers); a set-user-id bit it sets lets any local user run them
  as that user. The bits are cleared after the call.

:func:`scan` walks the writable roots before a call (directories only), :func:`clean` after
it (with a ``stat`` of each file) and undoes what is new, returning one line per thing undone
for the tool's result: about 0.1 s and 0.25 s for a tree of 43,000 entries here.

Not promised: the walk stops after :data:`MAX_ENTRIES` entries per root (a larger tree is
checked only that far) and does not follow symbolic links; between the tool's exit and the
clean-up (milliseconds) the files exist; other files that act later (a Makefile, a shell rc
file, an editor's project settings) are the user's to review, as with any code a tool writes.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Sequence

MAX_ENTRIES = 50_000
_SET_ID = stat.S_ISUID | stat.S_ISGID


@dataclass
class Found:
    repositories: set[str] = field(default_factory=set)  # .git entries and bare repositories
    set_id: set[str] = field(default_factory=set)  # regular files with a set-id bit


def is_bare_repository(path: str) -> bool:
    """What git takes for a repository directory: ``HEAD``, ``objects/`` and ``refs/``."""
    return (os.path.isfile(os.path.join(path, "HEAD"))
            and os.path.isdir(os.path.join(path, "objects"))
            and os.path.isdir(os.path.join(path, "refs")))


def scan(roots: Sequence[str], set_id_since: float | None = None) -> Found:
    """The repositories under ``roots``; with ``set_id_since`` (a time), also the files with
    a set-id bit whose inode changed since then (a chmod changes it; a file left as it was
    is the user's own)."""
    found = Found()
    for root in roots:
        seen = 0
        for here, dirs, files in os.walk(root):
            seen += len(dirs) + len(files)
            if ".git" in dirs or ".git" in files:
                found.repositories.add(os.path.join(here, ".git"))
            if "HEAD" in files and is_bare_repository(here):
                found.repositories.add(here)
            dirs[:] = [d for d in dirs if d != ".git"]  # its contents are git's
            for name in files if set_id_since is not None else ():
                path = os.path.join(here, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_mode & _SET_ID \
                        and st.st_ctime >= set_id_since:
                    found.set_id.add(path)
            if seen > MAX_ENTRIES:
                break
    return found


DISARMED = ".disarmed-by-mlx-agent"


def _free_name(path: str) -> str:
    n, candidate = 1, path
    while os.path.lexists(candidate):
        n += 1
        candidate = f"{path}-{n}"
    return candidate


def clean(roots: Sequence[str], before: Found, since: float) -> list[str]:
    """Undo what a call that started at ``since`` (``time.time()``) left: repositories
    :func:`scan` did not find ``before`` it, set-id bits set since; one line each."""
    after = scan(roots, set_id_since=since - 1.0)  # a second's slack for coarse clocks
    notes = []
    for path in sorted(after.repositories - before.repositories):
        # renamed, not deleted: what the tool moved there may be the user's files; a bare
        # repository loses its HEAD, the one file of the three it may have added
        target = path if os.path.basename(path) == ".git" else os.path.join(path, "HEAD")
        renamed = _free_name(target + DISARMED)
        try:
            os.rename(target, renamed)
            notes.append(f"renamed {target} to {os.path.basename(renamed)}: the tool made a "
                         "git repository, whose config git would run outside the sandbox")
        except OSError as e:
            notes.append(f"could not rename {target}, from a git repository the tool made: "
                         f"{e.strerror}; delete it before running git there")
    for path in sorted(after.set_id):
        try:
            os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) & ~_SET_ID)
            notes.append(f"cleared the set-user/group-id bit of {path}")
        except OSError as e:
            notes.append(f"could not clear the set-id bit of {path}: {e.strerror}")
    return notes
