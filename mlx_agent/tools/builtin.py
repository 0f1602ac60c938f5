"""Built-in tools over one directory: read_file, list_files, grep, write_file, run_tests.

Every path the model gives is resolved inside the root: ``..``, absolute paths and symlinks
that land outside are refused. ``run_tests`` runs the root's pytest suite (or unittest when
pytest is absent) in its own process group with the tool timeout. This is path isolation,
not a security boundary: ``run_tests`` executes whatever code is in the root, confined only by
the ``sandbox`` given to :func:`builtin_tools`; the other four run in-process, unsandboxed.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from .executor import ToolResult, run_process, tool_env
from .sandbox import Sandbox
from .schema import Tool

_SKIP_DIRS = {".git", "__pycache__", ".venv", "node_modules", ".pytest_cache"}
_MAX_LIST = 500
_MAX_MATCHES = 200


class OutsideRoot(ValueError):
    pass


def inside(root: Path, path: str | None) -> Path:
    """``path`` resolved under ``root``; raises OutsideRoot when it lands elsewhere."""
    root = root.resolve()
    target = (root / (path or ".")).resolve()
    if target != root and root not in target.parents:
        raise OutsideRoot(f"{path!r} is outside the tool root")
    return target


def _relative(root: Path, p: Path) -> str:
    return p.relative_to(root.resolve()).as_posix() or "."


def _files(root: Path, start: Path):
    if start.is_file():
        yield start
        return
    for dirpath, dirnames, filenames in os.walk(start):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.resolve().is_relative_to(root.resolve()):  # skip symlinks leading out
                yield p


def read_file(root: Path, path: str) -> str:
    target = inside(root, path)
    if not target.is_file():
        raise FileNotFoundError(f"no file {path!r}")
    return target.read_bytes().decode("utf-8", "replace")


def list_files(root: Path, path: str = ".") -> str:
    start = inside(root, path)
    if not start.exists():
        raise FileNotFoundError(f"no file or directory {path!r}")
    files = [_relative(root, p) for p in _files(root, start)]
    more = len(files) - _MAX_LIST
    return "\n".join(files[:_MAX_LIST] + ([f"…[{more} more]"] if more > 0 else []))


def grep(root: Path, pattern: str, path: str = ".") -> str:
    start = inside(root, path)
    regex = re.compile(pattern)
    hits = []
    for p in _files(root, start):
        try:
            lines = p.read_text("utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        hits += [f"{_relative(root, p)}:{i}: {line}" for i, line in enumerate(lines, 1)
                 if regex.search(line)]
        if len(hits) >= _MAX_MATCHES:
            return "\n".join(hits[:_MAX_MATCHES] + ["…[more matches]"])
    return "\n".join(hits) if hits else "no matches"


def write_file(root: Path, path: str, content: str) -> str:
    target = inside(root, path)
    if target == root.resolve() or target.is_dir():
        raise IsADirectoryError(f"{path!r} is a directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(content)
    os.replace(tmp, target)
    return f"wrote {len(content.encode('utf-8'))} bytes to {_relative(root, target)}"


def run_tests(root: Path, timeout: float, env_names=(),
              sandbox: Sandbox | None = None) -> ToolResult:
    root = root.resolve()
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
                  sandbox: Sandbox | None = None) -> list[Tool]:
    """The five built-in tools bound to ``root``; ``run_tests`` runs under ``sandbox``."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise NotADirectoryError(f"--root {root} is not a directory")

    def obj(props: dict, required: list[str]) -> dict:
        return {"type": "object", "properties": props, "required": required,
                "additionalProperties": False}

    return [
        Tool(name="read_file", description="Read a UTF-8 text file.",
             parameters=obj({"path": _string("File path, relative to the root.")}, ["path"]),
             builtin=functools.partial(read_file, root)),
        Tool(name="list_files", description="List files under a directory, recursively.",
             parameters=obj({"path": _string("Directory path. Defaults to the root.")}, []),
             builtin=functools.partial(list_files, root)),
        Tool(name="grep", description="Search file lines with a Python regular expression.",
             parameters=obj({"pattern": _string("Regular expression."),
                             "path": _string("File or directory. Defaults to the root.")},
                            ["pattern"]),
             builtin=functools.partial(grep, root)),
        Tool(name="write_file", description="Create or overwrite a file with the given content.",
             parameters=obj({"path": _string("File path."),
                             "content": _string("Complete new file content.")},
                            ["path", "content"]),
             builtin=functools.partial(write_file, root)),
        Tool(name="run_tests", description="Run the repository's test suite.",
             parameters=obj({}, []),
             builtin=functools.partial(run_tests, root, timeout, tuple(env_names), sandbox)),
    ]
