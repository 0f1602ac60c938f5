"""Run tool calls: ``_exec`` bash templates and Python handlers, with bounded output.

An ``_exec`` template never sees model text spliced into it. Each argument is pre-assigned
as a shell variable, single-quote escaped (strings as they are, numbers as JSON numbers,
booleans ``true``/``false``, objects and arrays as JSON, null as empty), and the template
refers to it as ``"$name"``. The command runs under ``/bin/bash -c`` with stdin closed, an
environment of only PATH, HOME, LANG and the names the user allowed, in a new process group.
On timeout the group gets SIGTERM, then SIGKILL 0.5 s later; after any run, whatever is left
of the group is killed, so background grandchildren die with it. So is the whole group when the
wait is interrupted (Ctrl-C, SIGTERM): the new session that keeps a terminal's Ctrl-C from the
tool also kept it running after the CLI had exited. A thread no signal reaches (a worker of
``eval --batch``) stops its calls with :func:`stopped_by`.

stdout and stderr are each capped (head and tail around a ``…[truncated N bytes]`` marker),
read as they arrive so memory stays bounded however much a tool prints; undecodable bytes
are replaced. A handler's return value is capped the same way as it is encoded, a piece at a
time. :func:`run_tool` never raises: an argument a shell variable cannot hold (NUL, a lone
surrogate), one that would replace a ``--tool-env`` variable, a handler's exception or our own
failure all come back as a :class:`ToolResult`, whose text is always valid Unicode.

Given a :class:`~mlx_agent.tools.sandbox.Sandbox` (``sandbox=``), a command runs confined by
the OS (bubblewrap or Seatbelt: see :mod:`mlx_agent.tools.sandbox` for what that does and does
not stop); without one (the default) it can do anything the user's shell can. Handlers
(``_handler`` tools and built-ins other than ``run_tests``) run in-process: they are never
sandboxed and not interrupted by the timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from typing import Any, Iterator, Sequence

import msgspec

from ..signals import held_back
from . import leftovers
from .sandbox import Sandbox
from .schema import Tool

DEFAULT_CAP = 8 * 1024
BASE_ENV = ("PATH", "HOME", "LANG")
_KILL_GRACE = 0.5
_DRAIN_GRACE = 2.0  # for the output pipes, once the process and its group are gone
_CHUNK = 64 * 1024
POLL = 0.1  # s: how often a waiting call looks at its stopped_by event
_scope = threading.local()


class ToolResult(msgspec.Struct, frozen=True):
    tool: str
    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    timed_out: bool = False
    duration_sec: float = 0.0

    def for_model(self) -> str:
        """The JSON object the model reads in its tool turn (always valid UTF-8 text)."""
        return valid_text(json.dumps({"tool": self.tool, "stdout": self.stdout,
                                      "stderr": self.stderr, "exit_code": self.exit_code},
                                     ensure_ascii=False))


def valid_text(text: str) -> str:
    """``text`` with lone surrogates (which no encoder, tokenizer or log accepts) as '?'."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def error_result(tool: str, message: str) -> ToolResult:
    """A call that did not run (unknown tool, invalid arguments, denied, ...)."""
    return ToolResult(tool=tool, stderr=f"error: {message}", exit_code=-1)


class _Capped:
    """Keeps the first and last ``cap // 2`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int):
        self.half = max(cap // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        view = memoryview(data)  # slices of a big chunk are not copied
        room = self.half - len(self.head)
        if room > 0:
            self.head += view[:room]
            view = view[room:]
        if len(view) >= self.half:
            self.tail[:] = view[-self.half:]
        elif view:
            self.tail += view
            if len(self.tail) > self.half:
                del self.tail[: len(self.tail) - self.half]

    def skip(self, n: int) -> None:
        """Count ``n`` bytes of the middle that were never read (after a full head)."""
        self.total += n

    def text(self) -> str:
        dropped = self.total - len(self.head) - len(self.tail)
        if dropped <= 0:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace")
        head = bytes(self.head).decode("utf-8", "replace")
        tail = bytes(self.tail).decode("utf-8", "replace")
        return f"{head}…[truncated {dropped} bytes]{tail}"


def _pump(stream, sink: _Capped) -> None:
    with stream:
        while chunk := stream.read1(_CHUNK):
            sink.feed(chunk)


def _feed(stream, data: bytes) -> None:
    try:
        with stream:
            stream.write(data)
    except (BrokenPipeError, ValueError):  # it ended, or was killed, before reading it all
        pass


@contextlib.contextmanager
def stopped_by(event: threading.Event) -> Iterator[None]:
    """Inside the block, the calls this thread makes (tools, checks, MCP calls) end as soon
    as ``event`` is set (from another thread): their process group is killed and the call
    raises KeyboardInterrupt, as Ctrl-C does in the main thread; once it is set, a call
    raises before it starts. For worker threads, which no signal reaches: without it a
    Ctrl-C waited for each worker's tool to run to its timeout."""
    previous = getattr(_scope, "event", None)
    _scope.event = event
    try:
        yield
    finally:
        _scope.event = previous


def check_stop() -> None:
    """Raises KeyboardInterrupt when the calling thread's :func:`stopped_by` event is set."""
    event = getattr(_scope, "event", None)
    if event is not None and event.is_set():
        raise KeyboardInterrupt


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


_ARG_ROOM = 100_000
# an _exec script too long for one argument: read from stdin, which the tool then does not see
_FROM_STDIN = 'exec 3<&0 </dev/null; s=$(cat <&3); exec 3<&-; eval "$s"'


def run_process(
    argv: Sequence[str],
    *,
    tool: str,
    timeout: float,
    cwd: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    cap: int = DEFAULT_CAP,
    sandbox: Sandbox | None = None,
    stdin: bytes | None = None,
) -> ToolResult:
    """Run ``argv`` in its own process group with bounded output. ``stdin`` is written to
    its standard input (else it reads nothing). Raises only KeyboardInterrupt (Ctrl-C,
    SIGTERM, a :func:`stopped_by` event), once the group is killed and what the sandbox
    checks is undone.

    Under a ``sandbox``, ``env=None`` means the reduced :func:`tool_env`, not ours."""
    if sandbox is None or sandbox.backend == "none":
        return _run(argv, tool=tool, timeout=timeout, cwd=cwd, env=env, cap=cap, stdin=stdin)
    cwd = os.fspath(cwd) if cwd is not None else os.getcwd()
    roots = sandbox.roots(cwd)
    try:  # the repositories to bind read-only; a root that cannot be walked is no crash
        before, since = leftovers.scan(roots), time.time()
        modes = leftovers.root_modes(roots)
    except OSError as e:
        return error_result(tool, f"could not check {', '.join(roots)} before running: "
                                  f"{e.strerror or e}")
    try:
        with sandbox.command(argv, cwd, tool_env() if env is None else env,
                             repositories=before.read_only) as (argv, env):
            result = _run(argv, tool=tool, timeout=timeout, cwd=cwd, env=env, cap=cap,
                          stdin=stdin)
    except OSError as e:
        result = error_result(tool, f"could not prepare the {sandbox.backend} sandbox: {e}")
    finally:  # also when a Ctrl-C cut the call: what it planted is undone all the same
        restored = leftovers.restore_roots(modes)  # first: the check walks them
        after = leftovers.clean(roots, before, since)
    return with_notes(result, before.notes + restored + after.notes, before.more + after.more)


def with_notes(result: ToolResult, notes: Sequence[str], more: int = 0) -> ToolResult:
    """``result`` with what the sandbox undid (or could not check) said after its stderr, in
    at most :data:`.leftovers.MAX_NOTES` lines and a count of the rest (``more``: those not
    even written)."""
    extra = max(len(notes) - leftovers.MAX_NOTES, 0) + more
    if not notes and not extra:
        return result
    lines = [*notes[:leftovers.MAX_NOTES], *([f"and {extra} more like these"] if extra else [])]
    said = "\n".join(f"sandbox: {line}" for line in lines)
    return msgspec.structs.replace(result, stderr=f"{result.stderr.rstrip()}\n{said}".lstrip())


def _run(argv: Sequence[str], *, tool: str, timeout: float, cwd, env, cap: int,
         stdin: bytes | None = None) -> ToolResult:
    start = time.monotonic()
    check_stop()
    proc = reaper = None
    try:
        # a Ctrl-C or SIGTERM while the tool starts is acted on once it has: then the group
        # it runs in is there to kill (it came between the start and the wait: the tool ran on)
        with held_back():
            try:
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        stdin=subprocess.DEVNULL if stdin is None
                                        else subprocess.PIPE,
                                        cwd=cwd, env=env, start_new_session=True)
            except OSError as e:
                return error_result(tool, f"could not start {argv[0]}: {e.strerror}")
            reaper = Reaper(proc)
            reaper.start()
            out, err = _Capped(cap), _Capped(cap)
            readers = [threading.Thread(target=_pump, args=(s, c), daemon=True)
                       for s, c in ((proc.stdout, out), (proc.stderr, err))]
            if stdin is not None:  # a thread: the pipe holds 64 KiB, the tool reads at will
                readers.append(threading.Thread(target=_feed, args=(proc.stdin, stdin),
                                                daemon=True))
            for r in readers:
                r.start()
        timed_out = not reaper.within(timeout)
        if timed_out:
            _kill_group(proc.pid, signal.SIGTERM)
            reaper.within(_KILL_GRACE)
    finally:
        # Whatever the command left behind in its group (background children holding the
        # pipes open) goes now, so the readers see end-of-file; on Ctrl-C, all of it.
        if proc is not None:
            with held_back():  # a second Ctrl-C acts once the tool is reaped
                _kill_group(proc.pid, signal.SIGKILL)
                reaper.reaped() if reaper is not None else proc.wait()
    # What is left in the pipes takes moments to read; a process that left the group (a
    # setsid daemon, unsandboxed) may hold them open forever, so the readers get one grace.
    deadline = time.monotonic() + _DRAIN_GRACE
    for r in readers:
        r.join(timeout=max(deadline - time.monotonic(), 0))
    return ToolResult(tool=tool, stdout=out.text(), stderr=err.text(),
                      exit_code=proc.returncode, timed_out=timed_out,
                      duration_sec=round(time.monotonic() - start, 4))


def waits(timeout: float) -> Iterator[float]:
    """The slices of a wait of ``timeout`` s, at most :data:`POLL` s each; between two,
    KeyboardInterrupt once the thread's :func:`stopped_by` event is set."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        yield max(min(left, POLL), 0)
        check_stop()
        if left <= POLL:
            return


class Reaper(threading.Thread):
    """A daemon thread that waits for a process to end and reaps it; the caller polls
    :attr:`ended`, a plain attribute, with short sleeps. A lock the caller's thread takes
    could be left held by a signal handler raising there (Ctrl-C, the CLI's SIGTERM):
    ``Popen.wait(timeout)`` polls by taking a lock just before the ``try`` that releases it,
    and the wait that reaps the killed tool then blocked for ever (CPython 3.11: the CLI hung
    once in CI); ``Thread.join`` interrupted so releases the joined thread's own lock
    (bpo-45274), and a later join returns before the process is reaped."""

    def __init__(self, proc: subprocess.Popen):
        super().__init__(daemon=True, name=f"reap-{proc.pid}")
        self.proc, self.ended, self.begun = proc, False, False

    def start(self) -> None:
        super().start()
        self.begun = True

    def run(self) -> None:
        try:
            self.proc.wait()
        finally:
            self.ended = True

    def within(self, timeout: float) -> bool:
        """Whether the process ended within ``timeout`` s (see :func:`waits`), looked at
        every 1 to 50 ms, as ``Popen.wait(timeout)`` itself looks."""
        delay = 0.0005
        for step in waits(timeout):
            end = time.monotonic() + step
            while not self.ended and (left := end - time.monotonic()) > 0:
                delay = min(delay * 2, left, 0.05)
                time.sleep(delay)
            if self.ended:
                return True
        return False

    def kill(self) -> None:
        """SIGKILL to the process, unless it has ended (no ``Popen.poll``: see the class)."""
        if not self.ended and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)

    def reaped(self) -> None:
        """Once the process (killed) is reaped, by this thread or, where it never started,
        here; no :func:`stopped_by` check in between."""
        if not self.begun:
            self.proc.wait()
            return
        while not self.ended:
            time.sleep(0.005)


def shell_value(value: Any) -> str:
    """How an argument appears as a shell variable (before quoting)."""
    if value is None:
        return ""
    if isinstance(value, bool):  # before int: JSON true is not 1
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def exec_script(tool: Tool, arguments: dict[str, Any]) -> str:
    """The bash script for an ``_exec`` tool: variable assignments, then the template."""
    lines = [f"{name}={shell_quote(shell_value(arguments.get(name)))}" for name in tool.exec_args]
    return "\n".join([*lines, tool.exec_template or ""])


def tool_env(allowed: Sequence[str] = ()) -> dict[str, str]:
    names = (*BASE_ENV, *allowed)
    return {n: os.environ[n] for n in names if n in os.environ}


def run_tool(
    tool: Tool,
    arguments: dict[str, Any],
    *,
    timeout: float = 30.0,
    env_names: Sequence[str] = (),
    cwd: str | os.PathLike | None = None,
    cap: int = DEFAULT_CAP,
    sandbox: Sandbox | None = None,
) -> ToolResult:
    """Run a validated call of ``tool``; never raises: every failure is a tool error.
    ``sandbox`` confines ``_exec`` tools; ``_handler`` tools and built-ins run in-process,
    unconfined (``run_tests`` gets its sandbox from
    :func:`~mlx_agent.tools.builtin.builtin_tools`)."""
    try:
        if tool.exec_template is not None:
            unfit = _unfit_arguments(tool, arguments, env_names)
            if unfit:
                return error_result(tool.name, unfit)
            script = exec_script(tool, arguments).encode("utf-8", "surrogateescape")
            big = len(script) > _ARG_ROOM  # Linux takes at most 128 KiB in one argument
            result = run_process(["/bin/bash", "-c", _FROM_STDIN if big else script.decode()],
                                 tool=tool.name, timeout=timeout, cwd=cwd,
                                 env=tool_env(env_names), cap=cap, sandbox=sandbox,
                                 stdin=script if big else None)
        else:
            result = _run_handler(tool, arguments, cap)
    except Exception as e:  # a bug of ours or of the machine: still the model's information
        return error_result(tool.name, valid_text(f"the tool failed to run: "
                                                  f"{type(e).__name__}: {e}"))
    return msgspec.structs.replace(result, tool=valid_text(result.tool),
                                   stdout=valid_text(result.stdout),
                                   stderr=valid_text(result.stderr))


def _unfit_arguments(tool: Tool, arguments: dict[str, Any], env_names: Sequence[str]) -> str:
    """Why the arguments cannot become shell variables ('' when they can)."""
    for name in tool.exec_args:
        value = shell_value(arguments.get(name))
        if "\0" in value:
            return f"argument {name!r} contains a NUL character, which a shell variable " \
                   "cannot hold"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"argument {name!r} is not valid Unicode (it holds a lone surrogate)"
        if name in env_names:
            return f"argument {name!r} would replace the environment variable {name} that " \
                   "--tool-env passes to the tool; rename the property"
    return ""


def _run_handler(tool: Tool, arguments: dict[str, Any], cap: int) -> ToolResult:
    start = time.monotonic()
    try:
        value = tool.resolve_handler()(**arguments)
    except Exception as e:  # a handler's failure is the model's information, not our crash
        return ToolResult(tool=tool.name, stderr=f"{type(e).__name__}: {e}", exit_code=1,
                          duration_sec=round(time.monotonic() - start, 4))
    if isinstance(value, ToolResult):
        return value
    # fed in pieces, so a big value is not copied whole (encoded, sliced) on its way in
    if isinstance(value, str):
        pieces = (value[i:i + _CHUNK] for i in range(0, len(value), _CHUNK))
    else:
        pieces = json.JSONEncoder(ensure_ascii=False, default=str).iterencode(value)
    capped = _Capped(cap)
    for piece in pieces:
        capped.feed(piece.encode("utf-8", "replace"))
    return ToolResult(tool=tool.name, stdout=capped.text(),
                      duration_sec=round(time.monotonic() - start, 4))
