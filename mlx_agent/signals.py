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
    over = False

    def hold(signum, frame):  # once the block is over, a handler left in place passes it on
        if over:
            _act(signum, previous[signum])
        else:
            caught.append(signum)

    try:
        for sig in HELD:
            if (handler := signal.getsignal(sig)) is not None:  # None: not Python's, left be
                previous[sig] = handler  # first: a signal just after the swap is undone too
                signal.signal(sig, hold)
        yield
    finally:
        over = True
        _restore(list(previous.items()))
        if caught:
            _act(caught[0], previous[caught[0]])


def _act(signum: int, handler) -> None:
    """What ``handler`` (a Python handler, SIG_DFL or SIG_IGN) does with ``signum``."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _restore(handlers: list) -> None:
    """Each ``(signal, handler)`` put back, every one even where a signal that the first put
    back handles raises at once (a Ctrl-C that came just then; one that comes before a
    handler is put back is passed on by the one left in place)."""
    if handlers:
        (sig, handler), rest = handlers[0], handlers[1:]
        try:
            signal.signal(sig, handler)
        finally:
            _restore(rest)
