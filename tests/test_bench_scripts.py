"""The benchmark scripts the README shows, as a user first runs them: ``--help``, and a
missing optional peer named in one line (the benchmarks themselves are not run in tests)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_cpu_seconds.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))


def test_bench_cpu_seconds_help_needs_no_llama_cpp():
    r = run("--help")
    assert r.returncode == 0 and "--prompt-tokens" in r.stdout, r.stderr


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None,
                    reason="llama-cpp-python is installed: the benchmark would run")
def test_bench_cpu_seconds_without_llama_cpp_says_how_to_install_it():
    """It raised ModuleNotFoundError at import, a traceback even for --help."""
    r = run("--repeats", "1")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "pip install -e '.[bench]'" in r.stderr
