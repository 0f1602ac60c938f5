"""--prompt-cache-dir and `mlx_agent cache` as a user runs them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from mlx_agent.user_key import ENV as KEY_ENV

from .conftest import files_cap
from .test_cache_files import MALFORMED, plant

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "mlx_agent.cli.main"]


def run(*args, timeout=300, **env):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})


def agent(kv, *extra, **kw):
    return run("agent", "--tools", str(ROOT / "examples/echo.json"), "--single", "Echo hi",
               "--max-tokens", "2", "--max-steps", "1", "--prompt-cache-dir", str(kv), *extra,
               **kw)


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
    upper = cache["key"].upper()  # the whole key: a prefix of digits alone has no case
    assert upper != cache["key"]
    rm = run("cache", "rm", str(kv), upper)  # hex in either case
    assert rm.returncode == 0 and "removed" in rm.stdout
    assert not list(kv.glob("*.safetensors"))


def test_int8_files_are_their_own_entries_at_about_half_the_bytes(tmp_path):
    kv = tmp_path / "kv"
    assert agent(kv).returncode in (0, 1)
    first = agent(kv, "--prompt-cache-dtype", "int8", "--json-out")
    assert not json.loads(first.stdout.splitlines()[0])["hit"]  # another key: a miss
    second = agent(kv, "--prompt-cache-dtype", "int8")
    assert "skipping prefill" in second.stderr, second.stderr
    sizes = sorted(p.stat().st_size for p in kv.glob("*.safetensors"))
    assert len(sizes) == 2 and sizes[0] < 0.6 * sizes[1]


def test_prune_keeps_the_directory_under_its_budget(tmp_path):
    kv = tmp_path / "kv"
    for system in ("one", "two", "three"):
        agent(kv, "--system", f"You are agent {system}.", "--prompt-cache-max-bytes", "3000000")
    files = list(kv.glob("*.safetensors"))
    assert len(files) == 1  # each entry is ~2.4 MB (float16): only the newest fits
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


def test_a_session_that_cannot_resume_is_not_saved_over_by_a_new_conversation(tmp_path):
    # `--resume S --save-session S` with other tools (or --no-adapter) warned "starting a
    # new conversation" and at exit replaced the saved conversation with that new one
    session = tmp_path / "s.safetensors"
    first = run("agent", "--tools", str(ROOT / "examples/echo.json"), "--single", "Echo hi",
                "--max-tokens", "4", "--max-steps", "1", "--save-session", str(session))
    assert first.returncode == 0 and session.exists(), first.stderr
    saved = session.read_bytes()
    for args in (["--builtin-tools", "--root", str(tmp_path)],
                 ["--tools", str(ROOT / "examples/echo.json"), "--no-adapter"]):
        r = run("agent", *args, "--single", "x", "--max-tokens", "2", "--max-steps", "1",
                "--resume", str(session), "--save-session", str(session))
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert f"cannot resume {session}: " in r.stderr, r.stderr
        assert "--save-session would replace it" in r.stderr, r.stderr
        assert session.read_bytes() == saved
        assert sorted(os.listdir(tmp_path)) == ["s.safetensors"]


def test_malformed_files_and_fifos_never_crash_or_hang_agent_or_cache(tmp_path):
    kv = tmp_path / "kv"
    first = agent(kv, "--json-out")
    key = json.loads(first.stdout.splitlines()[0])["key"]
    (path,) = kv.glob("*.safetensors")
    path.unlink()
    os.mkfifo(path)  # at the very path the next launch reads
    for name, spec in MALFORMED.items():
        plant(kv, name, spec)
    second = agent(kv, "--prompt-cache-max-bytes", "100000000", timeout=120)
    assert second.returncode == 0 and "Traceback" not in second.stderr, second.stderr
    assert "not usable: it is not a regular file (a FIFO)" in second.stderr
    assert path.is_file()  # replaced by the rebuilt cache

    os.mkfifo(kv / "fifo.safetensors")
    ls = run("cache", "ls", str(kv), timeout=60)
    assert ls.returncode == 0 and "Traceback" not in ls.stderr, ls.stderr
    assert key[:16] in ls.stdout
    assert f"1 entries, {path.stat().st_size} bytes; {len(MALFORMED) + 1} bad" in ls.stdout
    assert "bad: fifo.safetensors: it is not a regular file (a FIFO)" in ls.stdout
    assert "bad: tokens-many.safetensors: its metadata is not a prompt cache's" in ls.stdout
    assert "bad: deep.safetensors: its header is not a safetensors header" in ls.stdout
    rm = run("cache", "rm", str(kv), key[:10], timeout=60)
    assert rm.returncode == 0 and f"removed {path.name}" in rm.stdout, rm.stderr
    prune = run("cache", "prune", str(kv), "--max-bytes", "0", timeout=60)
    assert prune.returncode == 0, prune.stderr
    assert f"0 entries, 0 bytes left; {len(MALFORMED) + 1} other files left alone" in prune.stdout
    assert len(list(kv.iterdir())) == len(MALFORMED) + 1  # files not ours are left alone


def test_a_key_file_open_to_others_is_a_warning_and_nothing_loads(tmp_path):
    kv, key = tmp_path / "kv", tmp_path / "conf" / "cache.key"
    assert agent(kv, **{KEY_ENV: str(key)}).returncode == 0  # makes the key and the cache
    key.chmod(0o644)
    r = agent(kv, **{KEY_ENV: str(key)})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert f"run chmod 600 {key}" in r.stderr and "prompt cache is off" in r.stderr
    assert "skipping prefill" not in r.stderr


def test_a_full_disk_while_saving_a_cache_or_session_is_one_line_and_leaves_nothing(tmp_path):
    # MLX's writer raised a RuntimeError: a traceback after the answer. The cache is a
    # warning; the session, an output the user asked for, fails the run (exit 2)
    kv, session = tmp_path / "kv", tmp_path / "chat.session"
    r = subprocess.run([*CLI, "agent", "--tools", str(ROOT / "examples/echo.json"), "--single",
                        "Echo hi", "--max-tokens", "2", "--max-steps", "1", "--prompt-cache-dir",
                        str(kv), "--save-session", str(session)], capture_output=True,
                       text=True, timeout=300, preexec_fn=files_cap(64 << 10))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    cache, save = (next((line for line in r.stderr.splitlines() if what in line), "")
                   for what in ("cannot save the prompt cache", "cannot save the session"))
    assert "disk full" in cache and "disk full" in save, r.stderr
    assert cache.startswith("warning: ") and save.startswith("mlx_agent: error: "), r.stderr
    assert os.listdir(kv) == [] and os.listdir(tmp_path) == ["kv"]  # no partial files


def _undeletable(path: Path):
    """Make ``path`` impossible to delete (as a read-only disk or a sticky shared folder
    does): immutable as root, its folder read-only otherwise. Returns the undo, or None
    where neither works."""
    if os.geteuid() != 0:
        path.parent.chmod(0o500)
        return lambda: path.parent.chmod(0o700)
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        return None
    return lambda: subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_cache_file_that_cannot_be_deleted_is_one_line_never_a_traceback(tmp_path):
    # `cache rm`, `cache prune` and the agent's --prompt-cache-max-bytes raised the OSError
    kv = tmp_path / "kv"
    cache = json.loads(agent(kv, "--json-out").stdout.splitlines()[0])
    (path,) = kv.glob("*.safetensors")
    undo = _undeletable(path)
    if undo is None:
        import pytest

        pytest.skip("chattr cannot make a file immutable here")
    try:
        if os.geteuid() == 0:  # the folder itself writable: the new entry saves, then prunes
            r = agent(kv, "--system", "Another agent.", "--prompt-cache-max-bytes", "0")
            assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
            assert (f"warning: cannot prune the prompt cache in {kv}: cannot remove "
                    f"{path.name}: ") in r.stderr
            assert len(list(kv.glob("*.safetensors"))) == 2
        r = run("cache", "rm", str(kv), cache["key"][:8])
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith(f"mlx_agent: error: cannot remove {path.name}: ")
        assert r.stderr.count("\n") == 1
        if os.geteuid() == 0:  # a second entry of the key that can go: said gone, and warned
            copy = kv / "copy.safetensors"
            shutil.copyfile(path, copy)
            r = run("cache", "rm", str(kv), cache["key"][:8])
            assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
            assert r.stdout.startswith("removed copy.safetensors (") and not copy.exists()
            assert r.stderr.startswith(f"warning: cannot remove {path.name}: ")
            assert r.stderr.count("\n") == 1
        r = run("cache", "prune", str(kv), "--max-bytes", "0")  # the others still go
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith(f"warning: cannot remove {path.name}: ")
        assert r.stderr.count("\n") == 1 and "1 entries" in r.stdout
        assert list(kv.glob("*.safetensors")) == [path]
    finally:
        undo()
