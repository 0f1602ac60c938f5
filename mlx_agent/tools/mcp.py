"""Tools from Model Context Protocol servers, through the official ``mcp`` SDK.

:class:`McpServers` starts each server once (stdio: a child process; or Streamable HTTP by
``url``), lists its tools and turns them into :class:`~.schema.Tool` s whose ``builtin`` calls
``tools/call``. The SDK is async; one event loop in a background thread owns every session,
and the synchronous methods here wait on it with timeouts. A server that does not answer
``initialize`` and ``tools/list`` within the start-up timeout, or exits first, is a
:class:`McpError` naming it with the last line of its stderr. A call never raises: an
``isError`` result, a timeout or a server that died are tool results with exit code 1.

Stdio servers go through our own copy of the SDK's stdio transport, with bounds: one message
(one line) holds at most :data:`MAX_MESSAGE_BYTES`, and a server that writes more without a
newline is stopped at once (its process group killed), its start or call failing with one line
that says so; of its stderr only the last :data:`STDERR_TAIL` bytes are kept. Streamable HTTP
servers go through the SDK's transport with the client it would make itself, bounded alike: a
response body (as decoded) or one server-sent event past :data:`MAX_MESSAGE_BYTES` ends the
session at once, its start or call failing with one line that says so (the server is not ours
to stop).

Text content is the tool's stdout; other content is summarised (``[image/png, 1234 bytes]``);
the whole is capped like ``_exec`` output. Tool names keep the server's names, prefixed
``server__name`` where two servers (or a server and ``--tools``) offer the same one; schemas
go through the same checks as a tools file, and a tool that fails them is left out with a
warning naming the server and the tool.

:meth:`McpServers.close` (also on ``with`` exit) closes every session; the transport then
closes the server's stdin, and terminates and kills its process group. Stdio servers start
under the tool sandbox when one is given (``"network": true`` in a config entry lets one use
the network), as a tool's call does: the git repositories in its writable roots are read-only for
its whole life, and what it leaves there (new repositories, set-id bits) is undone after each
call (said in the call's result) and when it closes; a repository someone else makes there
while the server runs is disarmed too. What a server does is its own: an unsandboxed one can
do whatever the user can.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import os
import shlex
import threading
import time
from pathlib import Path
from typing import Any, Collection, Sequence

import anyio
import msgspec
from mcp import ClientSession
from mcp import types as mcp_types
from mcp.client.stdio import FORCE_KILL_TIMEOUT, PROCESS_TERMINATION_TIMEOUT, \
    get_default_environment
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from ..errors import UserFacingError
from ..fileio import read_regular
from ..json_errors import json_problem
from . import leftovers
from .executor import (DEFAULT_CAP, ToolResult, _Capped, error_result, tool_env, valid_text,
                       waits, with_notes)
from .sandbox import Sandbox
from .schema import Tool, ToolSchemaError, declared_tools

# The SDK logs a traceback for every line a server writes that is not JSON-RPC, through the
# last-resort handler to our stderr (a server printing "yes" wrote 950,000 lines in 20 s);
# a server that fails is ours to name, in one line.
logging.getLogger("mcp").addHandler(logging.NullHandler())
logging.getLogger("mcp").propagate = False

MAX_CONFIG_BYTES = 1 << 20  # an MCP config names a few servers
# What one server may list: past some hundreds the grammar cannot be compiled anyway, and a
# server paging without end grew memory until the start-up timeout
MAX_LISTED_TOOLS = 4096
# What one message from a server may hold (a stdio server's line, an HTTP server's response
# body or server-sent event): room for a big result (a screenshot in base64), while a server
# that never ends one cannot fill our memory (the SDK's readers kept it growing until the
# call's timeout)
MAX_MESSAGE_BYTES = 32 << 20
STDERR_TAIL = 4096  # what is kept of a server's stderr: its last line names a failure

START_TIMEOUT = 20.0
START_TIMEOUT_ENV = "MLX_AGENT_MCP_START_TIMEOUT"  # seconds; tests set it low
_LAUNCHERS = frozenset({"python", "python3", "node", "npx", "uvx", "uv", "deno", "bun", "bunx"})


class McpError(UserFacingError, RuntimeError):
    """A server that cannot be used (bad config, failed start); the message names it."""


class ServerSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One ``mcpServers`` entry: a stdio ``command`` (with ``args``, ``env``, ``cwd``) or a
    Streamable HTTP ``url``."""

    name: str = ""
    command: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str | None = None
    network: bool = False
    type: str | None = None  # some clients write "stdio" / "http"; the fields decide
    description: str | None = None


def spec_from_command(text: str) -> ServerSpec:
    """The server of ``--mcp "COMMAND ARGS..."``, named after its script or command."""
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise McpError(f"--mcp {text!r}: {e}") from None
    if not argv:
        raise McpError("--mcp needs a command, such as --mcp 'python server.py'")
    named = argv[0]
    if Path(argv[0]).name.rstrip("0123456789.") in _LAUNCHERS:
        named = next((a for a in argv[1:] if not a.startswith("-")), argv[0])
    name = Path(named).stem.replace("-", "_") or "mcp"
    return ServerSpec(name=name, command=argv[0], args=argv[1:])


def load_config(path: str | os.PathLike) -> list[ServerSpec]:
    """The servers of an ``{"mcpServers": {name: {...}}}`` file."""
    try:
        data = read_regular(path, max_bytes=MAX_CONFIG_BYTES)
        raw = msgspec.json.decode(data)
    except OSError as e:
        raise McpError(f"cannot read MCP config {path}: {e.strerror}") from None
    except msgspec.DecodeError as e:
        raise McpError(f"{path}: not valid JSON ({json_problem(e, data)})") from None
    except RecursionError:
        raise McpError(f"{path}: JSON nested too deeply to read") from None
    servers = raw.get("mcpServers") if isinstance(raw, dict) else None
    if not isinstance(servers, dict):
        raise McpError(f'{path}: expected {{"mcpServers": {{"name": {{"command": ...}}}}}}')
    specs = []
    for name, entry in servers.items():
        try:
            spec = msgspec.convert(entry, ServerSpec)
        except msgspec.ValidationError as e:
            raise McpError(f"{path}: server {name!r}: {e}") from None
        if (spec.command is None) == (spec.url is None):
            raise McpError(f"{path}: server {name!r} needs exactly one of 'command' and 'url'")
        specs.append(msgspec.structs.replace(spec, name=name))
    return specs


def unique_names(specs: Sequence[ServerSpec]) -> list[ServerSpec]:
    """``specs`` with repeated server names numbered (``files``, ``files_2``)."""
    seen: dict[str, int] = {}
    out = []
    for spec in specs:
        seen[spec.name] = seen.get(spec.name, 0) + 1
        n = seen[spec.name]
        out.append(spec if n == 1 else msgspec.structs.replace(spec, name=f"{spec.name}_{n}"))
    return out


@dataclasses.dataclass
class _Watch:
    """A sandboxed stdio server's writable roots, as checked when it started: what it leaves
    there (new git repositories, set-id bits, a root it locked) is undone after each call and
    at close."""

    roots: tuple[str, ...]
    before: leftovers.Found
    since: float
    modes: dict[str, int] = dataclasses.field(default_factory=dict)  # the roots' at start

    def clean(self, result: ToolResult | None = None) -> ToolResult | None:
        """Undo what the server left; ``result`` says so."""
        restored = leftovers.restore_roots(self.modes)
        after = leftovers.clean(self.roots, self.before, self.since)
        return with_notes(result, restored + after.notes, after.more) \
            if result is not None else None


@dataclasses.dataclass
class _Server:
    spec: ServerSpec
    watch: _Watch | None = None  # set for a sandboxed stdio server
    stop: asyncio.Event | None = None
    task: asyncio.Task | None = None
    session: Any = None
    listed: list[dict] = dataclasses.field(default_factory=list)
    dead: str = ""  # why the session ended, once it has
    stopped: str = ""  # why we stopped its stdio server: what any failure then reports
    stderr: bytes = b""  # the last STDERR_TAIL bytes of a stdio server's

    def last_stderr(self) -> str:
        lines = self.stderr.decode("utf-8", "replace").strip().splitlines()
        return lines[-1].strip() if lines else ""

    def describe_failure(self, what: str) -> str:
        last = self.last_stderr()
        return f"MCP server {self.spec.name!r} {self.stopped or what}" + \
            (f"; its stderr: {last}" if last else "")


class McpServers:
    """Started MCP servers and the tools they offer; use as a context manager."""

    def __init__(self, specs: Sequence[ServerSpec], *, sandbox: Sandbox | None = None,
                 start_timeout: float | None = None, call_timeout: float = 30.0,
                 cap: int = DEFAULT_CAP, cwd: str | None = None):
        self.specs = unique_names(specs)
        self.sandbox, self.call_timeout, self.cap = sandbox, call_timeout, cap
        self.cwd = cwd or os.getcwd()
        self.start_timeout = start_timeout or _env_timeout()
        self.servers: dict[str, _Server] = {}
        self.origin: dict[str, str] = {}  # tool name as the model sees it -> its server
        self._stack = contextlib.ExitStack()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> McpServers:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        """Start every server and list its tools; :class:`McpError` if one fails."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="mcp-client")
        self._thread.start()
        try:
            pending = [(self._launch(spec)) for spec in self.specs]
            for server, ready in pending:
                self._wait_ready(server, ready)
        except BaseException:
            self.close()
            raise

    def _launch(self, spec: ServerSpec):
        server = _Server(spec)
        self.servers[spec.name] = server
        ready: concurrent.futures.Future = concurrent.futures.Future()
        transport = self._transport(server)
        asyncio.run_coroutine_threadsafe(self._serve(server, transport, ready), self._loop)
        return server, ready

    def _wait_ready(self, server: _Server, ready: concurrent.futures.Future) -> None:
        try:
            ready.result(timeout=self.start_timeout)
        except concurrent.futures.TimeoutError:
            raise McpError(server.describe_failure(
                f"did not start within {self.start_timeout:g} s")) from None
        except Exception as e:
            raise McpError(server.describe_failure(
                f"failed to start ({_reason(e)})")) from None

    def _transport(self, server: _Server):
        """The SDK's client transport for ``server`` (a stdio one under the sandbox)."""
        spec = server.spec
        if spec.url is not None:
            return _http_client(server, spec.url)
        cwd = spec.cwd or self.cwd
        env = {**tool_env(), **spec.env}
        argv = [spec.command, *spec.args]
        if self.sandbox is not None and self.sandbox.backend != "none":
            box = dataclasses.replace(self.sandbox, network=self.sandbox.network or spec.network)
            roots = box.roots(cwd)
            try:  # its repositories are read-only for its whole life, as for a tool's call
                server.watch = _Watch(roots, leftovers.scan(roots), time.time(),
                                      leftovers.root_modes(roots))
            except OSError as e:
                raise McpError(f"MCP server {spec.name!r}: could not check "
                               f"{', '.join(roots)} before starting it ({e.strerror or e})"
                               ) from None
            argv, env = self._stack.enter_context(
                box.command(argv, cwd, env, repositories=server.watch.before.read_only))
        return _stdio_client(server, argv, env, cwd)

    async def _serve(self, server: _Server, transport, ready) -> None:
        """Owns one session from start to close (the SDK's contexts must exit in the task
        that entered them)."""
        server.stop = asyncio.Event()
        server.task = asyncio.current_task()
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = (await stack.enter_async_context(transport))[:2]
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                server.listed = await _list_tools(session)
                server.session = session
                ready.set_result(True)
                await server.stop.wait()
        except BaseException as e:  # noqa: BLE001 — reported to whoever waits on it
            server.dead = server.stopped or _reason(e)
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError(str(e)))
        finally:
            server.session = None
            server.dead = server.dead or "closed"

    def tools(self, taken: Collection[str] = ()) -> tuple[list[Tool], list[str]]:
        """The servers' tools and a warning for each left out; a name offered twice (or
        already in ``taken``) becomes ``server__name``, and one whose name is still taken
        (a tools file's ``server__name``, a server listing a name twice) is left out."""
        offered: dict[str, int] = {}
        for server in self.servers.values():
            for entry in server.listed:
                offered[entry.get("name")] = offered.get(entry.get("name"), 0) + 1
        tools, warnings, used = [], [], set(taken)
        for server in self.servers.values():
            for entry in server.listed:
                name = entry.get("name")
                public = name if offered[name] == 1 and name not in taken else \
                    f"{server.spec.name}__{name}"
                if public in used:
                    warnings.append(f"MCP server {server.spec.name!r}: tool {name!r} would be "
                                    f"named {public!r}, which another tool has; left out")
                    continue
                used.add(public)
                try:
                    tools.append(self._tool(server, entry, public))
                    self.origin[public] = server.spec.name
                except ToolSchemaError as e:
                    warnings.append(f"{e}; left out")
        return tools, warnings

    def _tool(self, server: _Server, entry: dict, public: str) -> Tool:
        source = f"MCP server {server.spec.name!r}"
        fields = {"name": public, "description": entry.get("description") or "",
                  "parameters": entry.get("inputSchema") or {"type": "object"}}
        if public != entry.get("name"):
            source = f"{source} (tool {entry.get('name')!r})"
        (schema,) = declared_tools([fields], source)

        def call(**arguments) -> ToolResult:
            return self.call(server.spec.name, entry["name"], arguments, public)

        return msgspec.structs.replace(schema, builtin=call)

    def call(self, server_name: str, name: str, arguments: dict, public: str | None = None
             ) -> ToolResult:
        """``tools/call`` on a server; never raises."""
        public = public or name
        start = time.monotonic()
        server = self.servers.get(server_name)
        session = server.session if server else None
        if session is None:
            why = server.describe_failure(f"is not running ({server.dead})") if server else \
                f"no MCP server {server_name!r}"
            return error_result(public, why)
        future = asyncio.run_coroutine_threadsafe(
            session.call_tool(name, arguments, read_timeout_seconds=self.call_timeout),
            self._loop)
        try:
            result = _result(future, self.call_timeout + 5)
        except KeyboardInterrupt:  # the user's, not the tool's: the agent loop handles it
            future.cancel()
            raise
        except Exception as e:  # a tool's failure is the model's information
            future.cancel()
            took = time.monotonic() - start
            # the SDK's own read timeout is an MCPError with this code, not a TimeoutError
            timed_out = isinstance(e, concurrent.futures.TimeoutError) or (
                getattr(e, "code", None) == mcp_types.REQUEST_TIMEOUT
                and took >= self.call_timeout)
            done = ToolResult(tool=public, stderr=valid_text(server.describe_failure(
                f"failed the call ({_reason(e)})")), exit_code=1, timed_out=timed_out,
                duration_sec=round(took, 4))
        else:
            wire = result.model_dump(mode="json", by_alias=True)
            done = ToolResult(tool=public, stdout=self._text(wire),
                              exit_code=1 if wire.get("isError") else 0,
                              duration_sec=round(time.monotonic() - start, 4))
        return server.watch.clean(done) if server.watch else done

    def _text(self, wire: dict) -> str:
        capped = _Capped(self.cap)
        for i, block in enumerate(wire.get("content") or []):
            capped.feed(("\n" if i else "").encode() + _summary(block).encode("utf-8", "replace"))
        return valid_text(capped.text())

    def close(self) -> None:
        """Close every session (the SDK stops each server's process group); idempotent."""
        if self._thread is not None and self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=15)
            except BaseException:  # noqa: BLE001 — closing: the group kill below still runs
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        if self._loop is not None and not self._thread.is_alive() and not self._loop.is_closed():
            self._loop.close()
        self._stack.close()
        for server in self.servers.values():  # what a server left since its last call
            if server.watch is not None:
                server.watch.clean()
                server.watch = None

    async def _shutdown(self) -> None:
        tasks = [s.task for s in self.servers.values() if s.task is not None]
        for server in self.servers.values():
            if server.session is None and server.task is not None:
                server.task.cancel()  # still starting: nothing to say goodbye to
            elif server.stop is not None:
                server.stop.set()
        if tasks:
            await asyncio.wait(tasks, timeout=12)


class MessageTooLarge(Exception):
    """A server that sent more than :data:`MAX_MESSAGE_BYTES` in one message."""


@contextlib.asynccontextmanager
async def _stdio_client(server: _Server, argv: list[str], env: dict[str, str], cwd: str):
    """The SDK's stdio transport (``mcp.client.stdio``) with bounds: a line past
    :data:`MAX_MESSAGE_BYTES` stops the server (:class:`MessageTooLarge` ends the session),
    and of its stderr only the tail is kept (the SDK had it write a file without end)."""
    process = await anyio.open_process(argv, env=get_default_environment() | env, cwd=cwd,
                                       start_new_session=True)
    to_session, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    stderr_read = anyio.Event()

    async def read_stdout() -> None:
        line = bytearray()
        async with to_session:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError,
                                     OSError):
                async for chunk in process.stdout:
                    *ends, rest = chunk.split(b"\n")
                    for end in ends:
                        await to_session.send(_message(line + end))
                        line.clear()
                    line += rest
                    if len(line) > MAX_MESSAGE_BYTES:
                        server.stopped = f"wrote a message over {MAX_MESSAGE_BYTES >> 20} MiB " \
                                         "without a newline; it was stopped"
                        raise MessageTooLarge(server.stopped)
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async for _ in process.stdout:  # the session is gone: let a writer finish and exit
                pass

    async def write_stdin() -> None:
        try:
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await to_session.aclose()  # the server stopped reading: the session sees the end

    async def keep_stderr() -> None:
        try:
            async for chunk in process.stderr:
                server.stderr = (server.stderr + chunk)[-STDERR_TAIL:]
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        finally:
            stderr_read.set()

    async with anyio.create_task_group() as tasks:
        for task in (read_stdout, write_stdin, keep_stderr):
            tasks.start_soon(task)
        try:
            yield read, write
        finally:
            with anyio.CancelScope(shield=True):  # the server must stop, even when cancelled
                read.close()
                write.close()
                await _stop(process, at_once=bool(server.stopped))
                with anyio.move_on_after(1):  # its last words, for describe_failure
                    await stderr_read.wait()
                if process.returncode is not None:  # else abandoned, as the SDK does
                    await process.aclose()  # its pipes, before the loop closes
            tasks.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def _http_client(server: _Server, url: str):
    """The SDK's Streamable HTTP transport, with the client it would make itself, bounded: a
    response body, or one server-sent event, past :data:`MAX_MESSAGE_BYTES` ends the session
    (the SDK read a JSON body whole)."""
    async with create_mcp_http_client() as client:
        client.event_hooks = {"response": [functools.partial(_bound_body, server)]}
        async with streamable_http_client(url, http_client=client,
                                          max_sse_event_size=MAX_MESSAGE_BYTES) as streams:
            yield streams


async def _bound_body(server: _Server, response) -> None:
    """Has ``response``'s body, as read (decoded: a gzipped one can grow a thousandfold),
    raise :class:`MessageTooLarge` past :data:`MAX_MESSAGE_BYTES`, or an event stream's past
    that many since its last event ended; ``server`` is disconnected then."""
    kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    read = response.aiter_bytes

    async def aiter_bytes(chunk_size: int | None = None):
        held, last = 0, b""
        async with contextlib.aclosing(read(chunk_size)) as chunks:
            async for chunk in chunks:
                held = _open_event(held, last, chunk) if kind == "text/event-stream" \
                    else held + len(chunk)
                if held > MAX_MESSAGE_BYTES:
                    server.stopped = f"sent a message over {MAX_MESSAGE_BYTES >> 20} MiB; " \
                                     "it was disconnected"
                    server.stop.set()  # the SDK makes some errors one request's, and goes on
                    raise MessageTooLarge(server.stopped)
                last = chunk[-1:] or last
                yield chunk

    response.aiter_bytes = aiter_bytes  # what aread() and the SDK's event parser read


# A blank line, however the lines end (an event stream's end in \r\n, \r or \n): an event's end
_EVENT_ENDS = (b"\n\n", b"\r\r", b"\n\r")


def _open_event(held: int, last: bytes, chunk: bytes) -> int:
    """The bytes of an event stream's open event after ``chunk``: ``held`` before it, ``last``
    the byte before it."""
    seen = last + chunk
    end = max(seen.rfind(mark) for mark in _EVENT_ENDS)
    return held + len(chunk) if end < 0 else len(seen) - end - 2


async def _stop(process, at_once: bool) -> None:
    """As the SDK does: close the server's stdin, give it a grace period to exit (none
    ``at_once``), then terminate, and kill, its process group."""
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        await process.stdin.aclose()
    if at_once or not await _exits(process, PROCESS_TERMINATION_TIMEOUT):
        await terminate_posix_process_tree(process, FORCE_KILL_TIMEOUT)
        await _exits(process, FORCE_KILL_TIMEOUT)


async def _exits(process, within: float) -> bool:
    """Whether ``process`` has ended within ``within`` s (polled: asyncio's wait() waits for
    its pipes too, which a child it left may hold)."""
    with anyio.move_on_after(within):
        while process.returncode is None:
            await anyio.sleep(0.01)
    return process.returncode is not None


def _message(line: bytes) -> SessionMessage | Exception:
    """One line of a server's stdout for the session: an error is an item it skips (a line
    that is not UTF-8 too: the SDK's "strict" reader stopped for good at one)."""
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(
            line.decode("utf-8", "replace"), by_name=False))
    except ValueError as e:
        return e


def _env_timeout() -> float:
    text = os.environ.get(START_TIMEOUT_ENV, "")
    if not text:
        return START_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < 1e6:
        raise McpError(f"${START_TIMEOUT_ENV} must be a number of seconds above 0, "
                       f"not {text!r}")
    return seconds


class TooManyTools(Exception):
    """A server that lists more than :data:`MAX_LISTED_TOOLS`."""


async def _list_tools(session) -> list[dict]:
    listed, cursor = [], None
    while True:
        page = await session.list_tools(**({"params": _page(cursor)} if cursor else {}))
        listed += [t.model_dump(mode="json", by_alias=True, exclude_none=True)
                   for t in page.tools]
        if len(listed) > MAX_LISTED_TOOLS:
            raise TooManyTools(f"it lists more than {MAX_LISTED_TOOLS} tools; serve fewer")
        cursor = getattr(page, "next_cursor", None) or getattr(page, "nextCursor", None)
        if not cursor:
            return listed


def _page(cursor):
    return mcp_types.PaginatedRequestParams(cursor=cursor)


def _summary(block: dict) -> str:
    """A content block as text: text as it is, anything else named with its size."""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind in ("image", "audio"):
        return f"[{block.get('mimeType', kind)}, {_decoded_size(block.get('data'))} bytes]"
    if kind == "resource":
        res = block.get("resource") or {}
        if "text" in res:
            return f"[resource {res.get('uri', '')}]\n{res['text']}"
        return f"[resource {res.get('uri', '')}, {res.get('mimeType', 'binary')}, " \
               f"{_decoded_size(res.get('blob'))} bytes]"
    if kind == "resource_link":
        return f"[resource link {block.get('uri', '')}]"
    return f"[{kind} content]"


def _decoded_size(data: Any) -> int:
    try:
        return len(base64.b64decode(data or "", validate=False))
    except ValueError:
        return len(data or "")


def _result(future: concurrent.futures.Future, timeout: float):
    """``future``'s result within ``timeout`` s (else TimeoutError); KeyboardInterrupt once
    the thread's :func:`~.executor.stopped_by` event is set (a worker's call, cut)."""
    for step in waits(timeout):
        try:
            return future.result(timeout=step)
        except concurrent.futures.TimeoutError:
            if future.done():  # the call's own TimeoutError (3.11: the same class), not ours
                raise
    raise concurrent.futures.TimeoutError


def _reason(e: BaseException) -> str:
    """One line for an exception (the SDK's task groups wrap the real one)."""
    while getattr(e, "exceptions", None):  # an ExceptionGroup
        e = e.exceptions[0]
    if isinstance(e, (TimeoutError, concurrent.futures.TimeoutError)):
        return "timed out"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
