"""What the kernel micro-benchmarks share: the extension (or a clear exit where it cannot run)
and a best-of-N wall-clock timing of an MLX computation."""

from __future__ import annotations

import time

import mlx_agent  # noqa: F401  (the fast BLAS before mlx)
import mlx.core as mx

from mlx_agent.kernels import kernel_status
from mlx_agent.kernels.ext import extension


def require_extension():
    """The compiled kernels, or exit with the reason they do not run here."""
    ext = extension()
    if ext is None:
        raise SystemExit(f"the CPU kernels do not run here: {kernel_status().reason}")
    return ext


def best_ms(fn, repeats: int) -> float:
    """The fastest of ``repeats`` evaluations of ``fn()`` (after one warm-up), in ms."""
    mx.eval(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - start)
    return min(times) * 1000
