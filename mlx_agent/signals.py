"""Ctrl-C and SIGTERM held back while a block runs, so that what it hands over is whole.

:func:`held_back` defers SIGINT and SIGTERM in the main thread until the block ends, then acts
on the first that came as its handler would have (Python's KeyboardInterrupt, the CLI's
``Terminated``, or the default action). Used where a result is handed on (a row written and
its trajectory kept): an interrupt inside lost the row while its trajectory stayed, or handed
a result over twice.

Not promised: anything in other threads (signals reach only the main thread, so the block
runs as it is there), or a prompt exit from a block that does not end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator

HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def held_back() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous: dict[int, object] = {}
    try:
        for sig in HELD:
            if (handler := signal.getsignal(sig)) is not None:  # None: not Python's, left be
                previous[sig] = handler  # first: a signal just after the swap is undone too
                signal.signal(sig, lambda n, frame: caught.append(n))
        yield
    finally:
        _restore(list(previous.items()))
        if caught:
            handler = previous[caught[0]]
            if callable(handler):
                handler(caught[0], None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), caught[0])


def _restore(handlers: list) -> None:
    """Each ``(signal, handler)`` put back, every one even where a signal that the first put
    back handles raises at once (a Ctrl-C that came just then): a handler left held back
    for good kept every later SIGTERM from acting."""
    if handlers:
        (sig, handler), rest = handlers[0], handlers[1:]
        try:
            signal.signal(sig, handler)
        finally:
            _restore(rest)
