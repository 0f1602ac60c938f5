"""Progress on stderr: plain lines through a pipe, a redrawn bar on a terminal (a real pty)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys

SCRIPT = """
import time
from mlx_agent.progress import Progress
with Progress(4, "work", unit="task") as p:
    for i in range(4):
        time.sleep(0.02)
        p.advance(f"item {i} done")
print("stdout untouched")
"""


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "MLX_AGENT_PROGRESS"}
    env.update(extra)
    return env


def test_a_pipe_gets_one_plain_line_per_item():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       env=_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "stdout untouched\n"
    lines = r.stderr.splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("work 1/4 25% ") and lines[0].endswith(": item 0 done")
    assert "ETA" in lines[2] and ("task/s" in lines[2] or "s/task" in lines[2])
    assert lines[3].startswith("work 4/4 100% ") and " in 0:0" in lines[3]
    assert "\r" not in r.stderr and "\x1b" not in r.stderr


def _run_in_pty(code: str, env: dict) -> str:
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdin, stdout and stderr are the pty
        os.execve(sys.executable, [sys.executable, "-c", code], env)
    out = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child closed the pty
            break
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    return out.decode("utf-8", "replace")


def test_a_terminal_gets_a_bar_redrawn_in_place():
    out = _run_in_pty(SCRIPT, _env())
    assert "\r\x1b[Kwork " in out and "█" in out and "░" in out
    assert out.count("\r\x1b[Kwork ") == 5  # drawn on entry and after each item
    assert "item 3 done" in out and "4/4 100%" in out and "ETA" in out
    assert out.rstrip().endswith("stdout untouched")  # the bar's line was ended first


def test_the_environment_overrides_the_choice():
    out = _run_in_pty(SCRIPT, _env(MLX_AGENT_PROGRESS="lines"))
    assert "\x1b[K" not in out and "work 2/4 50%" in out
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       env=_env(MLX_AGENT_PROGRESS="off"), timeout=60)
    assert r.returncode == 0 and r.stderr == ""


def test_figures_rate_and_eta():
    import io

    from mlx_agent.progress import Progress

    now = [100.0]
    p = Progress(10, "x", stream=io.StringIO(), clock=lambda: now[0])
    assert p.figures() == "0/10 0%"
    now[0] += 4
    p.advance(n=2)
    assert p.figures() == "2/10 20% 2.0 s/it ETA 0:16"
    now[0] += 116
    p.advance(n=8)
    assert p.figures() == "10/10 100% 12.0 s/it in 2:00"
