"""Ctrl-C and SIGTERM held back while a block runs (mlx_agent.signals), in real processes."""

from __future__ import annotations

import subprocess
import sys

import pytest

INTERRUPTED_AT = """
import os, signal, sys
from mlx_agent.signals import held_back
at = int(sys.argv[1])
def term(signum, frame):
    raise SystemExit(143)
signal.signal(signal.SIGTERM, term)
signal.signal(signal.SIGINT, signal.default_int_handler)
def interrupt(frame, event, arg):  # Ctrl-C just after the at-th handler read or set
    global at
    if event == "c_return" and getattr(arg, "__name__", "") in ("signal", "getsignal"):
        at -= 1
        if at == 0:
            sys.setprofile(None)
            os.kill(os.getpid(), signal.SIGINT)
sys.setprofile(interrupt)
try:
    with held_back():
        pass
except KeyboardInterrupt:
    pass
sys.setprofile(None)
sys.exit(0 if signal.getsignal(signal.SIGTERM) is term
         and signal.getsignal(signal.SIGINT) is signal.default_int_handler else 5)
"""


@pytest.mark.parametrize("at", range(1, 9))
def test_a_ctrl_c_while_the_handlers_are_swapped_leaves_both_as_they_were(at):
    """A Ctrl-C just after SIGINT's handler was put back raised before SIGTERM's was: SIGTERM
    stayed held back for good, and a later one did nothing."""
    r = subprocess.run([sys.executable, "-c", INTERRUPTED_AT, str(at)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr


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
