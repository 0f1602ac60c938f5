"""--prompt-cache-dir and `mlx_agent cache` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "mlx_agent.cli.main"]


def run(*args):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))


def agent(kv, *extra):
    return run("agent", "--tools", str(ROOT / "examples/echo.json"), "--single", "Echo hi",
               "--max-tokens", "2", "--max-steps", "1", "--prompt-cache-dir", str(kv), *extra)


def test_second_launch_loads_the_system_prompt_and_damage_is_a_warning(tmp_path):
    kv = tmp_path / "kv"
    first = agent(kv, "--json-out")
    assert first.returncode in (0, 1), first.stderr
    cache = json.loads(first.stdout.splitlines()[0])
    assert cache["type"] == "cache" and not cache["hit"] and cache["prefill_ms"] > 0
    second = agent(kv)
    assert f"loaded system-prompt cache ({cache['tokens']} tokens) — skipping prefill" in second.stderr
    (path,) = kv.glob("*.safetensors")
    path.write_bytes(path.read_bytes()[:1000])
    third = agent(kv, "--json-out")
    assert third.returncode == 0 and "not usable" in third.stderr and "Traceback" not in third.stderr
    assert json.loads(third.stdout.splitlines()[0])["hit"] is False
    assert "skipping prefill" in agent(kv).stderr  # rebuilt and replaced

    ls = run("cache", "ls", str(kv))
    assert ls.returncode == 0 and cache["key"][:16] in ls.stdout and "1 entries" in ls.stdout
    bad = run("cache", "rm", str(kv), "ffffffff")
    assert bad.returncode == 2 and "no entry" in bad.stderr
    rm = run("cache", "rm", str(kv), cache["key"][:10])
    assert rm.returncode == 0 and "removed" in rm.stdout
    assert not list(kv.glob("*.safetensors"))


def test_prune_keeps_the_directory_under_its_budget(tmp_path):
    kv = tmp_path / "kv"
    for system in ("one", "two", "three"):
        agent(kv, "--system", f"You are agent {system}.", "--prompt-cache-max-bytes", "6000000")
    files = list(kv.glob("*.safetensors"))
    assert len(files) == 1  # each entry is ~4.7 MB: only the newest fits
    out = run("cache", "prune", str(kv), "--max-bytes", "0")
    assert out.returncode == 0 and "0 entries" in out.stdout


def test_an_unwritable_cache_dir_is_a_warning_and_exit_0(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = agent(blocker / "kv")
    assert r.returncode == 0 and "cannot save the prompt cache" in r.stderr
    assert "Traceback" not in r.stderr


def test_save_session_then_resume_without_prefill(tmp_path):
    session = tmp_path / "s.safetensors"
    first = run("agent", "--tools", str(ROOT / "examples/echo.json"), "--single", "Echo hi",
                "--max-tokens", "4", "--save-session", str(session))
    assert first.returncode == 0 and session.exists(), first.stderr
    second = run("agent", "--tools", str(ROOT / "examples/echo.json"), "--single", "Again",
                 "--max-tokens", "4", "--resume", str(session), "--json-out")
    assert second.returncode == 0 and "resumed session" in second.stderr, second.stderr
    stats = json.loads(second.stdout.splitlines()[-1])
    assert stats["reused_tokens"] > stats["prefilled_tokens"]
    other = run("agent", "--builtin-tools", "--root", str(tmp_path), "--single", "x",
                "--max-tokens", "2", "--resume", str(session))
    assert other.returncode == 0 and "cannot resume" in other.stderr
