"""The sandbox's policy rendering, its resolver, and --sandbox on the command line.

The Seatbelt profile cannot run here: its text is checked. The resolver is driven by real
PATHs (an empty one, a ``bwrap`` that fails). The CLI runs end to end with the real model,
forced to call a tool that tries to get out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_agent.tools import Sandbox, SandboxUnavailable, resolve_sandbox
from mlx_agent.tools.sandbox import Policy, bwrap_argv, seatbelt_argv, seatbelt_profile, unavailable

from .test_sandbox import BWRAP_MISSING, area  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "mlx_agent.cli.main"]
needs_bwrap = pytest.mark.skipif(BWRAP_MISSING is not None,
                                 reason=f"bwrap unavailable: {BWRAP_MISSING}")
linux_only = pytest.mark.skipif(sys.platform == "darwin", reason="Seatbelt exists on macOS")


def policy(network=False, writable=("/work/repo", "/work/out")):
    return Policy(cwd="/work/repo", writable=writable, network=network,
                  env=(("LANG", "C.UTF-8"), ("PATH", "/usr/bin")), home="/h", tmp="/t")


# -- rendering ------------------------------------------------------------------------------

def test_bwrap_argv_binds_the_roots_after_the_private_tmp():
    argv = bwrap_argv(policy(), ["/bin/bash", "-c", "ls"])
    assert argv[0] == "bwrap" and argv[-4:] == ["--", "/bin/bash", "-c", "ls"]
    flags = " ".join(argv)
    for flag in ("--unshare-all", "--die-with-parent", "--new-session", "--cap-drop ALL",
                 "--ro-bind / /", "--dev /dev", "--proc /proc", "--tmpfs /tmp", "--tmpfs /run",
                 "--chdir /work/repo"):
        assert flag in flags
    assert "--share-net" not in flags
    assert flags.index("--tmpfs /tmp") < flags.index("--bind /work/repo /work/repo")
    assert flags.index("--bind /work/out /work/out") < flags.index("-- /bin/bash")
    assert "--share-net" in bwrap_argv(policy(network=True), ["true"])


def test_the_environment_is_the_reduced_one_with_a_private_home():
    assert policy().environ() == {"LANG": "C.UTF-8", "PATH": "/usr/bin", "HOME": "/h",
                                  "TMPDIR": "/t"}


def test_seatbelt_profile_denies_by_default_and_names_paths_only_as_parameters():
    text = seatbelt_profile(policy())
    assert text.startswith("(version 1)\n(deny default)\n")
    assert text.count("(") == text.count(")")
    assert "(allow file-read*)" in text
    assert "network" not in text and "system-socket" not in text
    assert "/work" not in text  # paths arrive as -D parameters: nothing to escape
    for name in ("WRITABLE_0", "WRITABLE_1", "SANDBOX_TMP", "SANDBOX_HOME"):
        assert f'(subpath (param "{name}"))' in text
    with_network = seatbelt_profile(policy(network=True))
    assert "(allow network-outbound network-inbound system-socket)" in with_network
    assert with_network.count("(") == with_network.count(")")


def test_seatbelt_denies_writing_the_runtimes_own_code_after_allowing_the_roots():
    from dataclasses import replace

    text = seatbelt_profile(replace(policy(), own_code=("/work/repo/.venv",)))
    allow, deny = text.index("(allow file-write*"), text.index("(deny file-write*")
    assert allow < deny and '(subpath (param "OWN_CODE_0"))' in text[deny:]
    assert '(param "OWN_CODE_0")' not in text[allow:deny]  # never in the allow rule
    assert "(deny file-write*" not in seatbelt_profile(policy())


def test_seatbelt_argv_passes_the_profile_and_its_parameters():
    argv = seatbelt_argv(policy(writable=('/a "quoted" dir',)), ["/bin/bash", "-c", "ls"])
    assert argv[:3] == ["/usr/bin/sandbox-exec", "-p", seatbelt_profile(policy(writable=("x",)))]
    assert argv[3:6] == ['-DWRITABLE_0=/a "quoted" dir', "-DSANDBOX_TMP=/t", "-DSANDBOX_HOME=/h"]
    assert argv[6:] == ["--", "/bin/bash", "-c", "ls"]


def test_seatbelt_gets_a_scratch_home_and_tmp_for_the_call_only(tmp_path):
    box = Sandbox("seatbelt", writable=(str(tmp_path / "extra"),))
    with box.command(["true"], str(tmp_path), {"PATH": "/usr/bin"}) as (argv, env):
        home, tmp = Path(env["HOME"]), Path(env["TMPDIR"])
        assert home.is_dir() and tmp.is_dir() and not any(home.iterdir())
        assert f"-DWRITABLE_0={tmp_path.resolve()}" in argv
        assert f"-DWRITABLE_1={(tmp_path / 'extra').resolve()}" in argv
    assert not home.exists() and not tmp.exists()


def test_sandbox_rejects_an_unknown_backend():
    with pytest.raises(ValueError, match="unknown sandbox backend 'docker'"):
        Sandbox("docker")


# -- the resolver ---------------------------------------------------------------------------

@pytest.fixture
def fresh_probe():
    unavailable.cache_clear()
    yield
    unavailable.cache_clear()


@pytest.fixture
def broken_bwrap(tmp_path, monkeypatch, fresh_probe):
    """A ``bwrap`` on PATH that fails as it does where user namespaces are off."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    return bin_dir


@linux_only
def test_explicit_bwrap_that_is_not_installed_is_an_error(tmp_path, monkeypatch, fresh_probe):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailable, match="apt install bubblewrap.*--sandbox none"):
        resolve_sandbox("bwrap")


@linux_only
def test_explicit_bwrap_that_fails_is_an_error_with_its_reason(broken_bwrap):
    with pytest.raises(SandboxUnavailable, match="No permissions to create new namespace"):
        resolve_sandbox("bwrap")


@linux_only
def test_a_bwrap_that_cannot_start_is_named_once(tmp_path, monkeypatch, fresh_probe):
    fake = tmp_path / "bwrap"
    fake.write_bytes(b"\x7fELF not a program")  # the kernel refuses it: ENOEXEC
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailable) as e:
        resolve_sandbox("bwrap")
    assert str(e.value).startswith("--sandbox bwrap: could not start bwrap: ") \
        and str(e.value).count("bwrap") == 2, str(e.value)


@linux_only
def test_auto_falls_back_to_none_with_one_warning(broken_bwrap):
    warnings = []
    box = resolve_sandbox("auto", network=True, warn=warnings.append)
    assert box == Sandbox("none", network=True)
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith("tools run without a sandbox: bwrap does not work here")


@linux_only
def test_seatbelt_off_macos_is_an_error():
    with pytest.raises(SandboxUnavailable, match=r"needs macOS; or use --sandbox none"):
        resolve_sandbox("seatbelt")


@needs_bwrap
def test_auto_is_bwrap_where_it_works(fresh_probe):
    warnings = []
    assert resolve_sandbox("auto", writable=["/x"], warn=warnings.append) == \
        Sandbox("bwrap", writable=("/x",))
    assert warnings == []


def test_none_and_unknown_choices():
    assert resolve_sandbox("none") == Sandbox()
    with pytest.raises(ValueError, match="--sandbox must be one of auto, bwrap, seatbelt, none"):
        resolve_sandbox("jail")


# -- the command line -----------------------------------------------------------------------

def cli(*args, env=None, cwd=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})}, cwd=cwd)


@linux_only
@pytest.mark.parametrize("command", ["agent", "eval"])
def test_an_unavailable_sandbox_is_a_one_line_error(command, tmp_path):
    (tmp_path / "tasks.jsonl").write_text("{}")
    args = ["--tools", str(ROOT / "examples/echo.json"), "--single", "x"] \
        if command == "agent" else ["--tasks", str(tmp_path / "tasks.jsonl")]
    r = cli(command, *args, "--sandbox", "bwrap", env={"PATH": str(tmp_path)})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "mlx_agent: error: --sandbox bwrap: bwrap is not installed (Debian/Ubuntu: apt install "
        "bubblewrap); or use --sandbox none to run tools unconfined"]


def test_sandbox_option_is_checked():
    r = cli("agent", "--tools", str(ROOT / "examples/echo.json"), "--sandbox", "jail")
    assert r.returncode == 2 and "'jail' is not one of 'auto', 'bwrap', 'seatbelt', 'none'" \
        in r.stderr


@needs_bwrap
def test_agent_runs_the_models_call_in_bwrap(tmp_path, area):
    root, outside = area / "root", area / "outside" / "new"
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{
        "name": "probe", "description": "Probe the machine.",
        "_exec": f"echo inside > in.txt; echo pwned > {outside}; "
                 "tr '\\0' '\\n' < /proc/$PPID/environ | grep -c SECRET_FOR_TEST"}]))
    transcript = tmp_path / "t.jsonl"
    r = cli("agent", "--tools", str(tools), "--root", str(root), "--sandbox", "bwrap",
            "--tool-choice", "probe,none", "--single", "Probe.", "--max-tokens", "16",
            "--max-steps", "2", "--transcript", str(transcript),
            env={"SECRET_FOR_TEST": "x"})
    assert r.returncode in (0, 1), r.stderr
    assert "bwrap sandbox]" in r.stderr  # the banner says what is in force
    call = next(json.loads(line) for line in transcript.read_text().splitlines()
                if json.loads(line)["type"] == "tool_call")
    assert call["tool"] == "probe" and "Read-only file system" in call["stderr"]
    assert call["stdout"].strip() == "0"  # the secret is in no environment the tool sees
    assert (root / "in.txt").read_text() == "inside\n" and not outside.exists()


@needs_bwrap
def test_eval_confines_the_tools_and_the_shell_check(tiny_lm, tmp_path, area):
    from mlx_agent.evaluate import run

    from .test_agent_loop import Script

    outside = area / "outside"
    (tmp_path / "tools.json").write_text(json.dumps([{
        "name": "escape", "description": "Escape.", "_exec": f"echo x > {outside}/by-tool"}]))
    (tmp_path / "tasks.jsonl").write_text(json.dumps({
        "prompt": "go", "tools": "tools.json",
        "check": {"shell": f"echo x > {outside}/by-check; test -f {outside}/by-tool"}}))
    script = Script(tiny_lm, '{"tool": "escape", "arguments": {}}', '{"answer": "done"}')
    summary = run(tiny_lm, tmp_path / "tasks.jsonl", sampler_for=lambda seed: script,
                  config_overrides={"grammar": False, "sandbox": Sandbox("bwrap")})
    assert summary.runs[0].calls == 1 and summary.runs[0].reward == 0.0
    assert not (outside / "by-tool").exists() and not (outside / "by-check").exists()


def test_a_python_that_lives_in_tmp_stays_visible_under_bwrap(monkeypatch, tmp_path):
    """A project (and its virtual environment) under /tmp must still start its Python
    inside the private /tmp: it is bound read-only again (CI clones into /tmp)."""
    from mlx_agent.tools.sandbox import Sandbox, bwrap_argv

    monkeypatch.setattr(sys, "prefix", "/tmp/proj/.venv")
    policy = Sandbox("bwrap").policy(str(tmp_path), {}, home="/tmp/home", tmp="/tmp")
    assert "/tmp/proj/.venv" in policy.runtime
    argv = bwrap_argv(policy, ["true"])
    bind = argv.index("/tmp/proj/.venv") - 1
    assert argv[bind] == "--ro-bind" and bind > argv.index("--tmpfs")


@needs_bwrap
@pytest.mark.parametrize("sandbox,escapes", [("bwrap", False), ("none", True)])
def test_synth_runs_tools_for_their_results_in_the_sandbox(tmp_path, area, sandbox, escapes):
    """synth runs each tool to learn its result: under the sandbox, as eval would."""
    outside = area / "outside" / "new"
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{
        "name": "probe", "description": "Probe the machine.",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}},
                       "required": ["n"]},
        "_exec": f'echo pwned > {outside} 2>/dev/null; echo "$n"', "_exec_args": ["n"]}]))
    r = cli("synth", "--tools", str(tools), "--out", str(tmp_path / "tasks"), "--n-train", "2",
            "--n-heldout", "1", "--sandbox", sandbox)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert outside.exists() == escapes
