"""The per-user secret that authenticates prompt-cache and session files.

32 random bytes, hex, in a file outside any cache directory: ``$MLX_AGENT_CACHE_KEY_FILE`` when
set, else ``~/Library/Application Support/mlx_agent/cache.key`` on macOS and
``$XDG_CONFIG_HOME/mlx_agent/cache.key`` (default ``~/.config``) elsewhere. The first use creates
it, mode 0600, atomically: the key is written to a private temporary file and hard-linked into
place, which fails if the file exists, so processes racing to create it all end up with the one
that won, and no reader ever sees half a key.

A key file that is not a regular file (a symbolic link, a FIFO, a directory), that belongs to
another user, or that group or others may read or write is refused with :class:`KeyFileError`
and never read. Not promised: protection from anyone who can act as this user; the key only
stops files written without it (by another user, another machine, or by hand) from loading.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import sys
from pathlib import Path

ENV = "MLX_AGENT_CACHE_KEY_FILE"
_KEY_BYTES = 32


class KeyFileError(OSError):
    """The key file cannot be used; the message says why and what to do."""


def key_path() -> Path:
    """Where the key lives (see the module docstring); nothing is read or created."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        xdg = os.environ.get("XDG_CONFIG_HOME", "")
        base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".config"
    return base / "mlx_agent" / "cache.key"


def load(path: str | os.PathLike | None = None) -> bytes:
    """The key at ``path`` (default :func:`key_path`), created on first use."""
    path = Path(path).expanduser() if path is not None else key_path()
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    try:
        _create(path)
        return _read(path)
    except KeyFileError:
        raise
    except OSError as e:
        raise KeyFileError(f"cannot create the cache key {path}: {e.strerror or e}; set "
                           f"{ENV} to a file in a writable directory") from None


def _read(path: Path) -> bytes:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise FileNotFoundError(errno.ENOENT, "no key file", str(path)) from None
        if e.errno in (errno.ELOOP, errno.EMLINK):  # macOS and Linux spell O_NOFOLLOW's refusal
            raise KeyFileError(f"the cache key {path} is a symbolic link; replace it with the "
                               "file itself (mode 0600)") from None
        raise KeyFileError(f"cannot read the cache key {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"the cache key {path} is not a regular file; remove it and a new "
                               "key is made")
        if st.st_uid != os.getuid():
            raise KeyFileError(f"the cache key {path} belongs to another user; remove it and a "
                               "new key is made")
        if st.st_mode & 0o077:
            raise KeyFileError(f"the cache key {path} is open to other users (mode "
                               f"{stat.S_IMODE(st.st_mode):04o}); run chmod 600 {path}")
        text = os.read(fd, 4 * _KEY_BYTES)
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != _KEY_BYTES:
        raise KeyFileError(f"the cache key {path} is not {2 * _KEY_BYTES} hex digits; remove "
                           "it and a new key is made (old cache files then rebuild)")
    return key


def _create(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.write(fd, (secrets.token_hex(_KEY_BYTES) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # exclusive, like O_EXCL, but the file is already complete
        except FileExistsError:
            pass  # another process made it first: everyone uses theirs
    finally:
        tmp.unlink(missing_ok=True)
