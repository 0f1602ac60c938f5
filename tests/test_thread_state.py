"""Threads that ran MLX work end cleanly however soon the interpreter finalizes after them."""

import subprocess
import sys
import textwrap

import pytest

# Four run_pool threads and a four-thread executor, each calling a compiled function, then the
# interpreter finalizes at once: without thread_state, 3 of 30 and 15 of 40 such processes
# aborted here ("terminate called without an active exception", exit -6).
SCRIPT = textwrap.dedent("""
    import mlx.core as mx
    from mlx_agent.batch_runner import run_pool
    from mlx_agent.thread_state import executor

    double = mx.compile(lambda x: x * 2)
    work = lambda context, item: double(mx.array([float(item)])).item()
    assert run_pool([None] * 4, range(8), work) == [2.0 * i for i in range(8)]
    pool = executor(4, "test")
    assert list(pool.map(lambda i: work(None, i), range(16))) == [2.0 * i for i in range(16)]
    pool.shutdown(wait=True)
""")


@pytest.mark.parametrize("run", range(8))
def test_threads_that_used_mlx_do_not_abort_the_exit(run):
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "terminate" not in r.stderr
