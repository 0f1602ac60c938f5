"""Built-in tools over one directory: read_file, list_files, grep, write_file, run_tests.

Every path the model gives is walked inside the root by :mod:`.rootfs`, a directory
descriptor at a time (``openat`` with ``O_NOFOLLOW``): ``..`` above the root, absolute paths
elsewhere and symlinks that lead out are refused, and a symlink swapped in mid-call cannot
redirect a read or a write. ``read_file`` reads at most the output cap (head and tail of a big
file); ``grep`` runs Python's ``re`` in a child process, so the tool timeout ends a pattern that
backtracks; ``write_file`` replaces the file atomically and leaves nothing behind if it fails,
and never writes inside a ``.git`` directory (git runs its config and hooks later, unconfined).
``run_tests`` runs the root's pytest suite (or unittest when pytest is absent) in its own
process group with the tool timeout, confined by the ``sandbox`` given to
:func:`builtin_tools` (it executes whatever code is in the root); the other four run
in-process, never sandboxed, kept inside the root by the walk above.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import sys
from pathlib import Path

import msgspec

from . import rootfs
from .executor import DEFAULT_CAP, ToolResult, _Capped, run_process, tool_env
from .rootfs import OutsideRoot
from .sandbox import Sandbox, own_code
from .schema import Tool

__all__ = ["OutsideRoot", "advised_tool", "builtin_tools", "rebound"]

_MAX_LIST = 500
_MAX_MATCHES = 200


# the advice a not-found error gives: read_file's (its quoted word is letters and digits),
# list_files' and grep's, and the paths it may mean (the same tool again, another path)
_ADVICE = re.compile(r"; (?:to find the files that mention '[^\W_]+', call the (grep) tool with "
                     r"it as the pattern|to see which files there are, call the (list_files) "
                     r"tool|(leave) the path out to (?:list|search) every file|(did) you mean "
                     r"'[^'\n]{1,300}'(?: or '[^'\n]{1,300}'){0,2}\?)\s*\Z")


READ_ONLY = frozenset({"read_file", "list_files", "grep"})


def reads_only(tool: Tool) -> bool:
    """Whether ``tool`` is a built-in tool that only reads (read_file, list_files, grep)."""
    return tool.builtin is not None and tool.name in READ_ONLY


def advised_tool(tool: Tool, result: ToolResult) -> str | None:
    """The built-in tool that a failed ``result`` of the built-in ``tool`` tells the agent to
    call instead ("no file 'TODO'; to find the files that mention 'TODO', call the grep
    tool ..."; "leave the path out" or "did you mean": ``tool`` again), or None: only these
    tools' own advice is read, never another tool's error (an MCP server's or a test
    suite's text could name any tool)."""
    if not reads_only(tool) or not (result.exit_code or result.timed_out):
        return None
    m = _ADVICE.search(result.stderr[-1_000:])  # the runtime's own words end the error
    return None if m is None else m.group(1) or m.group(2) or tool.name  # leave, did: again


def _missing(root: str, path: str, error: FileNotFoundError, advice: str) -> FileNotFoundError:
    """``error`` with what to do: the paths under the root that ``path`` may mean ("no file
    'users.csv'; did you mean 'data/users.csv'?": :func:`.rootfs.near`), else ``advice``."""
    near = rootfs.near(root, path)
    return FileNotFoundError(f"{error}; did you mean {' or '.join(map(repr, near))}?" if near
                             else f"{error}; {advice}" if advice else str(error))


def read_file(root: str, cap: int, path: str) -> ToolResult:
    """The file's text; one bigger than ``cap`` bytes shows its head and tail, and only
    those are read."""
    try:
        fd = rootfs.open_in_root(root, path)
    except FileNotFoundError as e:  # a word, not a path: the model meant to search for it
        word = path.strip() if path.strip().isalnum() else ""
        raise _missing(root, path, e, f"to find the files that mention {word!r}, call the "
                       "grep tool with it as the pattern" if word else "to see which files "
                       "there are, call the list_files tool") from None
    try:
        size = os.fstat(fd).st_size
        capped = _Capped(cap)
        capped.feed(os.read(fd, capped.half))
        if size > 2 * capped.half:  # skip the middle without reading it
            capped.skip(size - 2 * capped.half)
            os.lseek(fd, size - capped.half, os.SEEK_SET)
        capped.feed(os.read(fd, capped.half))
    finally:
        os.close(fd)
    return ToolResult(tool="read_file", stdout=capped.text())


def list_files(root: str, path: str = ".") -> str:
    try:
        names = [rel for rel, _ in rootfs.files(root, path)]
    except FileNotFoundError as e:
        raise _missing(root, path, e, "leave the path out to list every file") from None
    more = len(names) - _MAX_LIST
    return "\n".join(names[:_MAX_LIST] + ([f"…[{more} more]"] if more > 0 else []))


def grep(root: str, timeout: float, cap: int, pattern: str, path: str = ".") -> ToolResult:
    """Matching lines as ``path:line: text``, at most 200, found by a child process that
    the timeout kills."""
    job = json.dumps({"root": root, "pattern": pattern, "path": path,
                      "max_matches": _MAX_MATCHES})  # ASCII: NUL and surrogates escaped
    r = run_process([sys.executable, "-I", rootfs.__file__, job], tool="grep", timeout=timeout,
                    cwd=root, env=tool_env(), cap=cap)
    if r.timed_out:
        return ToolResult(tool="grep", stdout=r.stdout, exit_code=r.exit_code, timed_out=True,
                          stderr=f"error: grep timed out after {timeout:g} s; a pattern with "
                                 "nested repeats such as (a+)+ can take exponential time: "
                                 "simplify it or narrow the path",
                          duration_sec=r.duration_sec)
    if r.exit_code and r.stderr.startswith("FileNotFoundError: "):  # the child's: the hint
        error = FileNotFoundError(r.stderr.strip().removeprefix("FileNotFoundError: "))
        missing = _missing(root, path, error, "leave the path out to search every file")
        return msgspec.structs.replace(r, stderr=f"FileNotFoundError: {missing}\n")
    return r


def write_file(root: str, path: str, content: str) -> str:
    data = content.encode("utf-8")  # before any file exists: a lone surrogate fails here
    rel = rootfs.write_atomic(root, path, data, protected=_own_code_folders())
    return f"wrote {len(data)} bytes to {rel}"


def _own_code_folders() -> frozenset:
    """This runtime's code folders as ``(st_dev, st_ino)``: write_file runs in-process, so
    the sandbox's read-only binds of them (:func:`.sandbox.own_code`) do not cover it."""
    keys = set()
    for path in own_code():
        with contextlib.suppress(OSError):
            st = os.stat(path)
            keys.add((st.st_dev, st.st_ino))
    return frozenset(keys)


def run_tests(root: str, timeout: float, env_names=(),
              sandbox: Sandbox | None = None) -> ToolResult:
    uses_pytest = shutil.which("pytest") is not None or _has_module("pytest")
    argv = [sys.executable, "-m", "pytest", "-q", "-x"] if uses_pytest else \
        [sys.executable, "-m", "unittest", "discover", "-v"]
    env = tool_env(env_names)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return run_process(argv, tool="run_tests", timeout=timeout, cwd=root, env=env, sandbox=sandbox)


@functools.cache
def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _string(description: str) -> dict:
    return {"type": "string", "description": description}


def builtin_tools(root: str | os.PathLike, *, timeout: float = 30.0, env_names=(),
                  cap: int = DEFAULT_CAP, sandbox: Sandbox | None = None) -> list[Tool]:
    """The five built-in tools bound to ``root``; ``timeout`` bounds grep and run_tests,
    ``cap`` the bytes of a file read_file reads; ``run_tests`` runs under ``sandbox``."""
    resolved = Path(root).resolve()
    if not resolved.is_dir():
        raise NotADirectoryError(f"--root {resolved} is not a directory")
    root = str(resolved)

    def obj(props: dict, required: list[str]) -> dict:
        return {"type": "object", "properties": props, "required": required,
                "additionalProperties": False}

    return [
        Tool(name="read_file", description="Read a UTF-8 text file.",
             parameters=obj({"path": _string("File path, relative to the root.")}, ["path"]),
             builtin=functools.partial(read_file, root, cap)),
        Tool(name="list_files", description="List files under a directory, recursively.",
             parameters=obj({"path": _string("Directory path. Defaults to the root.")}, []),
             builtin=functools.partial(list_files, root)),
        Tool(name="grep", description="Search file lines with a Python regular expression.",
             parameters=obj({"pattern": _string("Regular expression."),
                             "path": _string("File or directory. Defaults to the root.")},
                            ["pattern"]),
             builtin=functools.partial(grep, root, timeout, cap)),
        Tool(name="write_file", description="Create or overwrite a file with the given content.",
             parameters=obj({"path": _string("File path."),
                             "content": _string("Complete new file content.")},
                            ["path", "content"]),
             builtin=functools.partial(write_file, root)),
        Tool(name="run_tests", description="Run the repository's test suite.",
             parameters=obj({}, []),
             builtin=functools.partial(run_tests, root, timeout, tuple(env_names), sandbox)),
    ]


def rebound(tool: Tool, root: str | os.PathLike) -> Tool:
    """``tool``, if it is one of :func:`builtin_tools`, working over ``root`` instead of the
    directory it was made for (a built-in tool's root is bound when it is made: synthesis
    runs each call in a fresh copy of a fixture); any other tool as it is."""
    fn = tool.builtin
    if not (isinstance(fn, functools.partial) and fn.func in _ROOTED):
        return tool
    new_root = str(Path(root).resolve())
    return msgspec.structs.replace(
        tool, builtin=functools.partial(fn.func, new_root, *fn.args[1:], **fn.keywords))


_ROOTED = frozenset({read_file, list_files, grep, write_file, run_tests})  # root: argument 1
