"""HTTP/1.1 for ``serve``: uvicorn's h11 protocol with a deadline and a connection cap.

uvicorn waits forever for a request that arrives a byte at a time, or not at all, and
accepts sockets until the process runs out of file descriptors (then every accept logs a
traceback). Here a request's headers and body must arrive within ``request_timeout``
seconds of its first byte (or of the connection, for the first request): past that the
client gets a 408 and the connection closes. At most ``max_connections`` are open at once;
one more gets a 503 and is closed at once. Between requests uvicorn's keep-alive timeout
(5 s) closes idle connections, as before.

Not promised: limits per client address (one client can still take every connection for
``request_timeout`` seconds), or anything for HTTP/2 or websockets (not served).
"""

from __future__ import annotations

import asyncio
import json
import resource

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

REQUEST_TIMEOUT = 30.0
_SPARE_FDS = 128  # for the model's files, logs and whatever a request opens


def connection_cap() -> int:
    """Connections the process can hold with file descriptors to spare: the soft limit is
    raised to the hard one first, as servers do (macOS starts at 256)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    finite = hard != resource.RLIM_INFINITY
    for target in ([hard] if finite else [65536, 10240]):  # macOS refuses "infinity"
        if target <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
            break
        except (ValueError, OSError):
            continue
    return max(8, min(4096, soft - _SPARE_FDS))


def _plain_response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "code": status}}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


class GuardedH11Protocol(H11Protocol):
    """One connection: a 503 past the cap, a 408 for a request that does not arrive in time."""

    request_timeout: float = REQUEST_TIMEOUT
    max_connections: int = 1024

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.write(_plain_response(503, "Service Unavailable",
                                            "the server has too many open connections; "
                                            "retry in a moment"))
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
            self._arm()  # a request has begun (or is still coming): it has until the deadline
        else:
            self._disarm()  # the whole request is here, or the connection is closing

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # idle between requests: uvicorn's keep-alive timeout applies

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

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
        if self.cycle is None or self.cycle.response_complete:  # nothing answered it yet
            self.transport.write(_plain_response(
                408, "Request Timeout", f"the request did not arrive within "
                f"{self.request_timeout:g} s; send it whole"))
        elif self.cycle is not None:
            self.cycle.disconnected = True  # a handler reading the body sees the client gone
            self.cycle.message_event.set()
        self.transport.close()


def config(app, request_timeout: float = REQUEST_TIMEOUT,
           max_connections: int | None = None) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` with this module's protocol."""
    protocol = type("Protocol", (GuardedH11Protocol,), {
        "request_timeout": request_timeout,
        "max_connections": max_connections or connection_cap()})
    return uvicorn.Config(app, http=protocol, log_level="warning", timeout_graceful_shutdown=5)


def serve(app, sock, request_timeout: float = REQUEST_TIMEOUT,
          max_connections: int | None = None) -> None:
    """Run ``app`` on the listening ``sock`` until Ctrl-C (open streams get 5 s)."""
    server = uvicorn.Server(config(app, request_timeout, max_connections))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
