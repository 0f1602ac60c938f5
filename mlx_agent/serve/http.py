"""HTTP/1.1 for ``serve``: uvicorn's h11 protocol with a deadline and a connection cap.

uvicorn waits forever for a request that arrives a byte at a time, or not at all, and
accepts sockets until the process runs out of file descriptors (then every accept logs a
traceback). Here a request's headers and body must arrive within ``request_timeout``
seconds of its first byte (or of the connection, for the first request): past that the
client gets a 408 and the connection closes. At most ``max_connections`` are open at once;
one more gets a 503 and closes after a short lingering read (at once in a flood), and
asyncio accepts a small batch at a time, so a flood is refused before it takes the spare
descriptors. Between requests uvicorn's keep-alive timeout (5 s) closes idle connections.
A connection closed while its request's body is still arriving (a 413 answered after the
headers, to a client that asked for ``Connection: close``) lingers the same way, so the
client reads the answer rather than a reset.

A 408 whose request line arrived has the error body of that path's API (Ollama's under
``/api/``); a 503, refused before any request, and a 400 for bytes that are not HTTP/1.1
(uvicorn's is a plain-text line) have OpenAI's.

Not promised: limits per client address (one client can still take every connection for
``request_timeout`` seconds), or anything for HTTP/2 or websockets (not served).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
from typing import Callable

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .common import BadRequest
from .openai_api import error_body

REQUEST_TIMEOUT = 30.0
MAX_CONNECTIONS = 4096
_SPARE_FDS = 256  # for whatever a request opens, and a batch of accepts not yet refused
_ACCEPT_BATCH = 128
_LINGERING = 32  # refused connections that may linger: with a batch, well inside the spare
_LINGER = 2.0  # seconds a refused connection is read (and dropped) before it closes


def connection_cap(wanted: int | None = None) -> int:
    """Connections the process can hold with file descriptors to spare: ``wanted`` (default
    :data:`MAX_CONNECTIONS`) when the soft limit can be raised that far (macOS starts at
    256), else as many as it allows."""
    wanted = wanted or MAX_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = _open_descriptors()
    need = wanted + held + _SPARE_FDS
    if soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # macOS caps below its "infinity"
            pass
    return max(1, min(wanted, soft - held - _SPARE_FDS))


def _open_descriptors() -> int:
    """Descriptors this process holds now (the model's files, the BLAS's, the event loop's):
    connections get what is left."""
    for listing in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(listing))
        except OSError:
            continue
    return 64


def _error(status: int, reason: str, message: str, path: str = "") -> bytes:
    """A whole HTTP response for a connection that closes, with the error body of the API
    ``path`` belongs to (Ollama's ``{"error": ...}`` under ``/api/``; OpenAI's elsewhere,
    and before a request line names a path)."""
    shaped = {"error": message} if path.startswith("/api/") else \
        error_body(BadRequest(message, status=status))
    body = json.dumps(shaped).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


class _LingeringClose:
    """The connection's transport as uvicorn's request cycle sees it: a close while the
    request's body is still arriving (a 413 answered after the headers, to a client that
    asked for ``Connection: close``) lingers, as a refusal does; closing with the body unread
    reset the connection, and a client that writes its whole body before reading (urllib)
    met a broken pipe instead of the answer."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedH11Protocol):
        self._transport, self._protocol = transport, protocol

    def close(self) -> None:
        protocol = self._protocol
        if protocol.conn.their_state is h11.SEND_BODY and not self._transport.is_closing() \
                and not protocol._refused:
            protocol._linger()
        else:
            self._transport.close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class GuardedH11Protocol(H11Protocol):
    """One connection: a 503 past the cap, a 408 for a request that does not arrive in time."""

    request_timeout: float = REQUEST_TIMEOUT
    max_connections: int = MAX_CONNECTIONS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._refused = False
        self._raw = transport  # self.transport is it behind _LingeringClose
        super().connection_made(_LingeringClose(transport, self))  # type: ignore[arg-type]
        if len(self.connections) > self.max_connections:
            self._refuse(503, "Service Unavailable",
                         "the server has too many open connections; retry in a moment")
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped until the lingering close
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request already buffered
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes that are not HTTP/1.1 (a plain-text line there): the
        APIs' JSON error instead, and the same lingering close as a 408's."""
        self._refuse(400, "Bad Request", "the request is not valid HTTP/1.1; send a request "
                     "line, headers and a body of the length they declare")

    def _follow(self) -> None:
        """Armed while a request is arriving (its first bytes are here, its body is not all
        here); disarmed while it is answered, and between requests (uvicorn's keep-alive
        timeout applies there)."""
        state = self.conn.their_state
        arriving = state is h11.SEND_BODY or (state is h11.IDLE and self.conn.trailing_data[0])
        if arriving:
            self._arm()
        else:
            self._disarm()

    def _arm(self) -> None:
        if self._deadline is None and not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.request_timeout, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            return
        cycle = self.cycle if self.conn.their_state is h11.SEND_BODY else None
        if cycle is not None:  # a handler may be reading the body: it sees the client gone
            cycle.disconnected = True
            cycle.message_event.set()
        if cycle is None or not cycle.response_started:  # else the answer is on its way
            self._refuse(408, "Request Timeout", f"the request did not arrive within "
                         f"{self.request_timeout:g} s; send it whole",
                         cycle.scope["path"] if cycle is not None else "")
        else:
            self.transport.close()

    def _refuse(self, status: int, reason: str, message: str, path: str = "") -> None:
        """Answer ``status`` and close after a lingering read: closing with the client's
        bytes unread would reset the connection, and the client would never see why."""
        self._refused = True
        self._disarm()
        try:
            self.transport.write(_error(status, reason, message, path))
        except OSError:  # the client is gone already
            self.transport.close()
            return
        self._linger()

    def _linger(self) -> None:
        """Close after a lingering read of what the client still sends (dropped unread)."""
        self._refused = True
        self._disarm()
        transport = self._raw
        try:
            if transport.can_write_eof():
                transport.write_eof()
        except OSError:  # the client is gone already
            transport.close()
            return
        # a lingering connection holds a descriptor: past the cap and a few, close at once
        flood = len(self.connections) > self.max_connections + _LINGERING
        self.loop.call_later(0 if flood else _LINGER, transport.close)


def config(app, request_timeout: float = REQUEST_TIMEOUT,
           max_connections: int | None = None) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` with this module's protocol."""
    protocol = type("Protocol", (GuardedH11Protocol,), {
        "request_timeout": request_timeout,
        "max_connections": connection_cap(max_connections)})
    # backlog: how many connections asyncio accepts in one go before any is refused; each
    # takes a descriptor, so it must stay well inside the spare ones. uvicorn also listens
    # again with it, so it is the kernel's queue of connections not yet accepted too (the
    # CLI listens with the same 128): a burst past it waits for the client's SYN retry.
    return uvicorn.Config(app, http=protocol, log_level="warning", timeout_graceful_shutdown=5,
                          backlog=_ACCEPT_BATCH)


class _Server(uvicorn.Server):
    """uvicorn's server, calling ``on_exit`` when the exit signal comes: uvicorn's own
    shutdown reaches the app only after its grace period for open connections, and
    generations running until then were cut with a 500 and a traceback each."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]):
        super().__init__(config)
        self.on_exit = on_exit

    def handle_exit(self, sig, frame) -> None:
        self.on_exit()
        super().handle_exit(sig, frame)


def serve(app, sock, request_timeout: float = REQUEST_TIMEOUT,
          max_connections: int | None = None) -> None:
    """Run ``app`` on the listening ``sock`` until SIGTERM or Ctrl-C: running generations
    stop at once and answer 503 (the app's ``state.server.stop``); streams still open get 5 s."""
    server = _Server(config(app, request_timeout, max_connections), app.state.server.stop)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
