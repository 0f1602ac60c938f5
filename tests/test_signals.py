"""Ctrl-C and SIGTERM held back while a block runs (mlx_agent.signals), in real processes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .ctrl_c import CTRL_C_AT

INTERRUPTED_AT = CTRL_C_AT + """
import time
from mlx_agent.signals import held_back
def term(signum, frame):
    raise SystemExit(143)
signal.signal(signal.SIGTERM, term)
ctrl_c_at(int(sys.argv[1]))  # just after the at-th return of any C function
try:
    with held_back():
        pass
except KeyboardInterrupt:
    pass
sys.setprofile(None)
os.kill(os.getpid(), signal.SIGTERM)  # acted on: the CLI's handler exits 143
time.sleep(1)
sys.exit(5)
"""


@pytest.mark.parametrize("at", range(1, 41))
def test_a_ctrl_c_while_the_handlers_are_swapped_leaves_sigterm_acting(at):
    """A Ctrl-C just after SIGINT's handler was put back raised before SIGTERM's was: SIGTERM
    stayed held back for good, and a later one did nothing (here, after the 19th C call and
    two others). A handler left in place now passes a signal on once the block is over."""
    r = subprocess.run([sys.executable, "-c", INTERRUPTED_AT, str(at)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 143, r.stderr


HELD = """
import os, signal, sys, time
from mlx_agent.signals import held_back
signal.signal(signal.SIGINT, signal.default_int_handler)
order = []
try:
    with held_back():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        order.append("block ended")
except KeyboardInterrupt:
    order.append("interrupted")
print(order)
"""


def test_a_ctrl_c_inside_the_block_acts_once_the_block_ends():
    r = subprocess.run([sys.executable, "-c", HELD], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "['block ended', 'interrupted']", r.stderr
