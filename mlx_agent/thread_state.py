"""Threads that run MLX work free MLX's per-thread state before they end, under the GIL.

MLX keeps state per thread (the compile cache, the random key sequence, the streams), and its
C++ thread-local destructors take the GIL when the thread exits. ``Thread.join`` returns before
those destructors run, so a worker joined just before the interpreter finalizes takes the GIL
during finalization, is ended there (``pthread_exit`` unwinding through a destructor), and the
process aborts with "terminate called without an active exception". It happened in CI (an
``eval-bfcl --batch 4`` process, after its last line); a four-thread ``ThreadPoolExecutor``
that ran one compiled function did it in 15 of 40 processes here.

:func:`release_on_exit`, called in a thread, frees that state with ``mx.clear_streams()`` (as
MLX's own thread tests do) when the thread's Python state is cleared: in the thread, with the
GIL, before ``join`` returns. :func:`executor` is a ``ThreadPoolExecutor`` whose threads do so.
Not promised: arrays a thread made on its own streams and left unevaluated cannot be evaluated
after it ends (they could not be before either: the streams end with the thread).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx

_local = threading.local()


class _Release:
    """Held by one thread's local state; freed (in that thread) as the thread ends."""

    def __del__(self) -> None:
        mx.clear_streams()


def release_on_exit() -> None:
    """Free the calling thread's MLX state when it ends (once per thread is enough)."""
    if not hasattr(_local, "release"):
        _local.release = _Release()


def executor(max_workers: int, thread_name_prefix: str) -> ThreadPoolExecutor:
    """A thread pool whose threads free their MLX state as they end."""
    return ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=thread_name_prefix,
                              initializer=release_on_exit)
