"""Output paths checked before the work that fills them.

A run of minutes must not end in a traceback because its ``--out`` cannot be written: each
command checks its output paths before it loads the model, by writing there (a temporary
file, removed), which is the only test that covers permissions, read-only mounts and places
such as ``/proc``. A failure is one line that names the option and the path.

A directory the check creates is made when it is checked (an ``--out`` may lie inside a
``--trajectory-dir``) and remembered: :func:`remove_made` removes those still empty when the
command fails, so a run that stops early leaves no empty folders behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

from mlx_agent.fileio import cannot_create

from .errors import UserError


def _probe(directory: Path, option: str, path) -> None:
    try:
        fd, tmp = tempfile.mkstemp(prefix=".mlx_agent-probe.", dir=directory)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise UserError(f"{option} {path}: cannot write in {directory} ({e.strerror or e}); "
                        "choose a place you can write") from None


def writable_file(path: str | None, option: str, *, not_same_as: dict[str, str | None]
                  | None = None) -> None:
    """``path`` can be written as files here are (a temporary file beside it, renamed over
    it): so an existing one must be a regular file (renamed over, ``/dev/null`` or a FIFO
    would be replaced by a file), and not a file the command reads or writes otherwise
    (``not_same_as``: option to path)."""
    if path is None:
        return
    if not path:
        raise UserError(f"{option} is empty; give a file path")
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        st = None
    except OSError as e:  # ENAMETOOLONG, ELOOP, EACCES
        raise UserError(f"{option} {path}: {e.strerror or e}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise UserError(f"{option} {path} is a directory; give a file path")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UserError(f"{option} {path} is not a regular file (it would be replaced by "
                        "one); give a file path")
    _not_same(path, option, not_same_as)
    parent = p.parent
    if not parent.is_dir():
        raise UserError(f"{option} {path}: the directory {parent} does not exist; create it "
                        "first")
    _probe(parent, option, path)


_made: list[Path] = []  # directories writable_dir created, parents first


def _not_same(path: str, option: str, others: dict[str, str | None] | None) -> None:
    for other, other_path in (others or {}).items():
        if other_path and same_file(path, other_path):
            raise UserError(f"{option} {path} is the file {other} names; give another path")


def same_file(a: str, b: str) -> bool:
    """Whether the paths name one file (or would, once made)."""
    with contextlib.suppress(OSError):
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def writable_dir(path: str | None, option: str) -> None:
    """``path`` is (or is now created as, as the command would) a directory files can be
    written in. None: the option was not given; "" is an error (an unset ``"$OUT"``: the
    current directory would take the files, or a run would record nothing)."""
    if path is None:
        return
    if not path:
        raise UserError(f"{option} is empty; give a directory")
    missing = [p for p in (Path(path).absolute(), *Path(path).absolute().parents)
               if not os.path.lexists(p)]
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{option} {path} is a file; give a directory") from None
    except OSError as e:
        raise UserError(f"{option} {path}: cannot create the directory "
                        f"({cannot_create(e, path)}); choose a place you can write") from None
    finally:
        _made.extend(p for p in reversed(missing) if os.path.isdir(p))
    _probe(Path(path), option, path)


def remove_made() -> None:
    """Removes the directories the checks created that are still empty, deepest first (a
    directory something was written in stays, and so do its parents)."""
    while _made:
        try:
            _made.pop().rmdir()
        except OSError:
            pass


def appendable_file(path: str | None, option: str, *, not_same_as: dict[str, str | None]
                    | None = None) -> None:
    """``path`` is (or can be created as) a regular file to append to, and not a file the
    command reads or writes otherwise (``not_same_as``: option to path); opened without
    blocking, so a FIFO there is an error, not a wait for a reader."""
    if not path:
        return
    _not_same(path, option, not_same_as)
    existed = os.path.lexists(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
    except OSError as e:  # ENXIO: a FIFO that no one reads
        why = "not a regular file" if e.errno == errno.ENXIO else e.strerror
        raise UserError(f"{option} {path}: {why}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(f"{option} {path}: not a regular file")
    finally:
        os.close(fd)
        if not existed:  # the command makes it when it writes; a failure later leaves none
            os.unlink(path)
