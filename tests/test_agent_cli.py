"""`mlx_agent agent` end to end: the real bundled model, real tools, real subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_agent.agent import events as ev
from mlx_agent.tools import load_tools, run_tool

from .conftest import pid_alive, wait_for_line

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "mlx_agent.cli.main", "agent"]


def run(*args, stdin=None, cwd=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, input=stdin,
                          timeout=300, cwd=cwd, env=dict(os.environ))


def test_single_json_out_with_echo_tool_is_a_valid_event_stream(tmp_path):
    transcript = tmp_path / "t.jsonl"
    r = run("--tools", str(ROOT / "examples/echo.json"),
            "--single", "Echo hello.", "--json-out", "--max-tokens", "24", "--max-steps", "2",
            "--transcript", str(transcript))
    assert r.returncode == 0, r.stderr
    events = [ev.decode(line) for line in r.stdout.splitlines()]
    # the README's first example: echo("hello"), then an answer that says it (it used to
    # copy the result's JSON and stop at its first quote: "Here is what I got: {")
    answers = [e.text for e in events if isinstance(e, ev.Answer)]
    assert len(answers) == 1 and "hello" in answers[0], answers
    assert isinstance(events[0], ev.User) and events[0].text == "Echo hello."
    assert isinstance(events[-1], ev.Stats) and events[-1].turns >= 1
    assert events[-1].generated_tokens > 0 and events[-1].rendered_tokens > 0
    assert any(isinstance(e, ev.Assistant) for e in events)
    logged = [ev.decode(line) for line in transcript.read_text().splitlines()]
    assert [type(e) for e in logged if not isinstance(e, ev.ToolResult)] == [type(e) for e in events]


def test_repl_reads_until_quit():
    r = run("--tools", str(ROOT / "examples/echo.json"), "--max-tokens", "8", "--max-steps", "1",
            stdin="hello\n:quit\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("you> ") == 2 and "agent> " in r.stdout
    assert r.stdout.endswith("you> \n"), r.stdout  # the prompt's line ended, as at Ctrl-D


@pytest.mark.parametrize("args,message", [
    ([], "give --tools FILE, or --builtin-tools"),
    (["--builtin-tools"], "--builtin-tools needs --root"),
    (["--tools", "/no/such.json"], "cannot read tools file /no/such.json"),
])
def test_agent_usage_errors(args, message):
    r = run(*args, "--single", "x")
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_confirm_tools_shows_the_arguments_escaped():
    """The y/N prompt printed the model's arguments raw: a U+202E could make `rm -rf x`
    read as something else, a C1 control (\\x9b, a one-byte CSI) drive the terminal."""
    code = ("from mlx_agent.cli.agent import _confirm; import sys; "
            "sys.exit(_confirm('sh', {'cmd': 'echo \\u202ecba\\x9b\\x1b[2J'}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       input="n\n", timeout=60, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert "run sh({\"cmd\": \"echo \\u202ecba\\x9b\\u001b[2J\"})? [y/N]" in r.stderr, r.stderr


def test_schema_error_names_file_tool_and_field(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"name": "t", "_exec": "x", "parameters": {
        "type": "object", "properties": {"n": {"type": "int"}}}}]))
    r = run("--tools", str(bad), "--single", "x")
    assert r.returncode == 2
    assert str(bad) in r.stderr and "'t'" in r.stderr and "parameters.properties.n" in r.stderr


@pytest.fixture
def buggy_repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "loss.py").write_text("def xent(p):\n    return -sum(p)  # bug: no log\n")
    (repo / "tests" / "test_loss.py").write_text(
        "import math, sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parent.parent))\n"
        "from loss import xent\n\ndef test_xent():\n    assert xent([0.5]) == -math.log(0.5)\n")
    return repo


def test_readme_debugger_tools_work_as_written(buggy_repo, monkeypatch):
    # `python` in the tool is whatever PATH finds first: make it this environment's
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    tools = {t.name: t for t in load_tools(ROOT / "examples/debugger.json")}
    grep = run_tool(tools["grep_repo"], {"pattern": "xent"}, cwd=buggy_repo)
    assert "./loss.py:1:def xent(p):" in grep.stdout
    read = run_tool(tools["read_file"], {"path": "loss.py"}, cwd=buggy_repo)
    assert "bug: no log" in read.stdout
    test = run_tool(tools["run_test"], {"node": "tests/test_loss.py::test_xent"}, cwd=buggy_repo,
                    timeout=120)
    assert "1 failed" in test.stdout


def test_readme_debugger_command_runs(buggy_repo):
    r = run("--tools", str(ROOT / "examples/debugger.json"), "--root", str(buggy_repo),
            "--single", "tests/test_loss.py::test_xent fails. Find the cause.",
            "--max-tokens", "32", "--max-steps", "2")
    assert r.returncode in (0, 1), r.stderr
    assert "json protocol, 3 tools" in r.stderr and "grammar on" in r.stderr


def default_sigint():
    """In the child: Ctrl-C handled again, even when the tests run in a background job (which
    starts with SIGINT ignored, and Python then installs no KeyboardInterrupt handler)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupted_session(prompt: str | None, max_tokens: int, wait: float, sig: str = "SIGINT"):
    """Start a REPL, send ``prompt`` (none: leave it at the prompt), press Ctrl-C (or send
    ``sig``) after ``wait`` s, then quit: the process's exit code, stdout and stderr."""
    import signal
    import time

    # the raw model: it writes the long reply Ctrl-C must interrupt (the adapter is brief)
    proc = subprocess.Popen([*CLI, "--no-adapter", "--tools", str(ROOT / "examples/echo.json"),
                             "--no-grammar", "--max-tokens", str(max_tokens), "--max-steps", "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ), preexec_fn=default_sigint)
    # the banner comes once the model is loaded (after a warning, where there is no sandbox)
    banner = next(line for line in iter(proc.stderr.readline, "") if "protocol" in line)
    assert "json protocol" in banner
    if prompt is not None:
        proc.stdin.write(prompt + "\n")
        proc.stdin.flush()
    time.sleep(wait)
    proc.send_signal(getattr(signal, sig))
    time.sleep(0.5)
    with contextlib.suppress(BrokenPipeError):  # SIGTERM: the process may be gone already
        proc.stdin.write(":quit\n")
        proc.stdin.flush()
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


# Lengths no CPU gets through before the Ctrl-C: 2,000 tokens of reply (the raw model is still
# writing at its cap), a 5,000-token prompt (seconds of prefill even at 1,500 tok/s).
@pytest.mark.parametrize("prompt, max_tokens, wait", [
    ("Tell me a very long story about the sea.", 2000, 2.5),  # Ctrl-C while it replies
    ("sea " * 5000, 8, 1.0),  # Ctrl-C during prefill, before any reply
], ids=["reply", "prefill"])
def test_ctrl_c_stops_the_turn_not_the_session(prompt, max_tokens, wait):
    code, out, err = interrupted_session(prompt, max_tokens, wait)
    assert code == 0, err
    assert "(interrupted)" in err and "Traceback" not in err
    assert out.count("you> ") == 2  # the session asked for the next message


@pytest.mark.parametrize("prompt, max_tokens, wait", [
    ("Tell me a very long story about the sea.", 2000, 2.5), (None, 8, 0.5)],
    ids=["reply", "prompt"])
def test_sigterm_ends_the_session_where_ctrl_c_would_not(prompt, max_tokens, wait):
    """A kill (SIGTERM) ends the REPL with 143, whether it comes during a reply or at the
    prompt: the agent's Ctrl-C handling cut the reply (or dropped the line) and asked again."""
    code, out, err = interrupted_session(prompt, max_tokens, wait, sig="SIGTERM")
    assert code == 143, err
    assert "Traceback" not in err and out.count("you> ") == 1


def test_ctrl_c_at_the_prompt_asks_again():
    code, out, err = interrupted_session(None, 8, 0.5)
    assert code == 0, err
    assert ":quit or Ctrl-D" in err and "Traceback" not in err
    assert out.count("you> ") == 2


def test_files_adapter_reads_a_file_and_states_what_it_says(tmp_path):
    """models/smollm2-135m-files, the README's adapter for file work, on a request of the
    held-out examples/files set (its rows never saw that set's files or phrasing)."""
    root = tmp_path / "root"
    shutil.copytree(ROOT / "examples/files/fixture", root)
    r = run("--adapter", str(ROOT / "models/smollm2-135m-files"), "--builtin-tools",
            "--root", str(root), "--single", "Read notes.txt and tell me the launch date.",
            "--json-out", "--max-steps", "3")
    assert r.returncode == 0, r.stderr
    events = [ev.decode(line) for line in r.stdout.splitlines()]
    calls = [e for e in events if isinstance(e, ev.ToolCall)]
    answers = [e.text for e in events if isinstance(e, ev.Answer)]
    assert [c.tool for c in calls] == ["read_file"], calls
    assert len(answers) == 1 and "March 3" in answers[0], answers


def test_what_the_sandbox_undid_is_shown_to_the_user_too(tmp_path):
    """The model reads the sandbox's notes in the tool's result; the user saw only
    "exit 0" (a reviewer: a repository left armed was said to the model alone)."""
    from mlx_agent.tools.sandbox import unavailable

    if unavailable("bwrap") is not None:
        pytest.skip(unavailable("bwrap"))
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"name": "install", "description": "Install the helper",
                                  "_exec": "cp /bin/true helper && chmod 4755 helper"}]))
    root = tmp_path / "root"
    root.mkdir()
    r = run("--tools", str(tools), "--root", str(root), "--sandbox", "bwrap",
            "--tool-choice", "install,none", "--max-steps", "2", "--max-tokens", "16",
            "--single", "Install the helper.")
    assert r.returncode == 0, r.stderr
    assert "    sandbox: cleared the set-user/group-id bit of" in r.stderr, r.stderr
    assert not (root / "helper").stat().st_mode & 0o4000


def test_confirm_tools_at_the_end_of_input_is_no_not_an_abort():
    r = subprocess.run([*CLI, "--tools", str(ROOT / "examples/echo.json"), "--confirm-tools",
                        "--tool-choice", "echo,none", "--max-steps", "2", "--max-tokens", "24",
                        "--single", "Echo hi."], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=300)
    assert "(end of input: not run)" in r.stderr and "Aborted!" not in r.stderr, r.stderr
    assert "the user denied this tool call" in r.stderr and r.returncode in (0, 1), r.stderr


def test_a_grammar_that_gives_up_mid_reply_ends_the_turn_not_the_run(tmp_path):
    tools = tmp_path / "t.json"  # compiles; llguidance gives up a token into the call
    tools.write_text(json.dumps([{"name": "e", "description": "Echo.", "_exec": "echo ok",
                                  "parameters": {"type": "object", "required": ["a"], "properties": {
                                      "a": {"type": "string", "minLength": 5000}}}}]))
    r = run("--tools", str(tools), "--tool-choice", "e,none", "--max-steps", "2",
            "--max-tokens", "4000", "--single", "Call e.")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr  # no answer: 1, not 2
    assert "warning: the grammar gave up mid-reply" in r.stderr, r.stderr


def test_a_trajectory_the_disk_cannot_hold_is_named_in_the_error(tmp_path):
    # the OSError reached the command's catch-all for a failed standard output: "cannot
    # write the output (No space left on device)", with the answer printed fine
    from .conftest import files_cap

    r = subprocess.run([*CLI, "--tools", str(ROOT / "examples/echo.json"), "--single", "Echo hi",
                        "--max-tokens", "4", "--max-steps", "1", "--trajectory-dir",
                        str(tmp_path / "runs")], capture_output=True, text=True, timeout=300,
                       preexec_fn=files_cap(1024))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "cannot write the trajectory " + str(tmp_path / "runs") in r.stderr, r.stderr
    assert "File too large" in r.stderr and "the output" not in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []  # no partial file (and the folder it made removed)


def test_a_transcript_removed_during_the_run_ends_it_without_a_traceback(tmp_path):
    # a tool working in --root may delete the transcript the run made there
    from mlx_agent.cli.agent import _transcript

    path = tmp_path / "t.jsonl"
    with _transcript(str(path)):
        path.unlink()
    assert not path.exists()
    with _transcript(str(path)) as f:  # one left empty is still removed
        pass
    assert f.closed and not path.exists()
    with _transcript(str(path)) as f:
        f.write(b"{}\n")
    assert path.read_bytes() == b"{}\n"


def slow_tools(tmp_path: Path) -> tuple[Path, Path]:
    """A tools file whose tool writes its pid to a file, then sleeps for five minutes."""
    pids = tmp_path / "pids"
    tools = tmp_path / "slow.json"
    tools.write_text(json.dumps([{"name": "wait", "description": "Wait a while.",
                                  "parameters": {"type": "object", "properties": {}},
                                  "_exec": f"echo $$ >> '{pids}'; exec sleep 300"}]))
    return tools, pids


@pytest.mark.parametrize("sig,code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_kill_during_an_unsandboxed_tool_ends_the_tool_too(tmp_path, sig, code):
    """Without a sandbox (--sandbox none; macOS's Seatbelt, which has no --die-with-parent,
    alike) a tool runs in a session of its own, so a terminal's Ctrl-C does not reach it: the
    CLI exited 130 and left the tool running for its five minutes."""
    import signal

    tools, pids = slow_tools(tmp_path)
    proc = subprocess.Popen([*CLI, "--tools", str(tools), "--sandbox", "none",
                             "--tool-choice", "wait", "--single", "Wait.", "--max-steps", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ), preexec_fn=default_sigint)
    tool = int(wait_for_line(pids, proc).split()[0])
    try:
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == code and "Traceback" not in err, err
        assert not pid_alive(tool)  # killed and reaped before the CLI exited
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(tool, signal.SIGKILL)


def test_a_message_too_long_for_the_context_is_dropped_and_the_session_goes_on():
    # the message stayed in the conversation the model never saw: every later turn was
    # "the context is full" too, and --save-session kept it
    r = run("--tools", str(ROOT / "examples/echo.json"), "--context-length", "512",
            "--max-tokens", "16", "--max-steps", "2", "--tool-choice", "echo,none",
            "--json-out", stdin="word " * 2000 + "\nEcho hi.\n")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    stats = [e for e in map(ev.decode, r.stdout.splitlines()) if isinstance(e, ev.Stats)]
    assert [s.stop for s in stats] == ["context", "answer"], r.stderr
    assert r.stderr.count("warning: ") == 1 and "it was left out" in r.stderr, r.stderr
    # the fact, then one piece of advice (the engine's was in it too: "(... (raise
    # --context-length, or use a rotating --kv-window)); it was left out: send a shorter one")
    assert "--kv-window" not in r.stderr and "-token context); it was left out" in r.stderr, \
        r.stderr


def test_a_mistyped_repl_command_is_named_not_sent_to_the_model():
    # ":qiut" went to the model as a request: a whole turn, tools and all
    r = run("--tools", str(ROOT / "examples/echo.json"), "--max-tokens", "8", "--max-steps", "1",
            "--json-out", stdin=":qiut\n:Quit\n:q\n")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == "", r.stdout  # no turn ran
    assert r.stderr.count("unknown command") == 2, r.stderr
    assert "unknown command ':qiut'" in r.stderr, r.stderr


def test_a_transcript_the_disk_cannot_hold_ends_the_run_with_whole_lines_kept(tmp_path):
    # a traceback (File too large; on a full disk: "cannot write the output", as if stdout
    # had failed), with the event's line cut where the disk filled
    from .conftest import files_cap

    transcript = tmp_path / "t.jsonl"
    r = subprocess.run([*CLI, "--tools", str(ROOT / "examples/echo.json"), "--max-tokens", "16",
                        "--max-steps", "2", "--tool-choice", "echo,none", "--transcript",
                        str(transcript)], input="Echo hi.\nEcho bye.\n", capture_output=True,
                       text=True, timeout=300, preexec_fn=files_cap(600))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"cannot write the transcript {transcript}: File too large" in r.stderr, r.stderr
    assert "the output" not in r.stderr and r.stdout.count("you> ") == 1, r.stdout
    text = transcript.read_bytes()
    assert text.endswith(b"\n") and len(text) <= 600
    assert [ev.decode(line) for line in text.splitlines()]


def test_a_session_the_disk_cannot_hold_fails_the_run(tmp_path):
    # a warning and exit 0: a script went on to --resume a file that was never written
    from .conftest import files_cap

    session = tmp_path / "s.session"
    r = subprocess.run([*CLI, "--tools", str(ROOT / "examples/echo.json"), "--max-tokens", "8",
                        "--max-steps", "1", "--single", "hi", "--save-session", str(session)],
                       capture_output=True, text=True, timeout=300, preexec_fn=files_cap(100_000))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"mlx_agent: error: cannot save the session to {session}: " in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []  # no partial or temporary file


def test_a_reply_that_fills_the_context_says_how_large_it_is():
    # "the context is full (the context is full)"
    r = run("--tools", str(ROOT / "examples/echo.json"), "--context-length", "100",
            "--max-tokens", "64", "--max-steps", "1", "--tool-choice", "none", "--single", "hi")
    assert "Traceback" not in r.stderr, r.stderr
    assert "warning: the context is full (the reply reached the end of the 100-token " \
           "context)" in r.stderr, r.stderr
    # what it wrote is shown, its text not its JSON ('{"answer":"Hel'), but a reply cut
    # off is no answer: exit 1 (it was 0)
    assert r.returncode == 1 and r.stdout.strip(), (r.returncode, r.stdout)
    assert not r.stdout.startswith("{"), r.stdout


def test_an_answer_cut_by_max_tokens_is_shown_with_a_warning():
    # shown as the answer with nothing to say it was cut: '{"answer":"The' read as whole;
    # still exit 0, as a completion cut by max_tokens is one (finish_reason "length")
    r = run("--tools", str(ROOT / "examples/echo.json"), "--max-tokens", "5", "--max-steps", "1",
            "--tool-choice", "none", "--single", "Tell me a long story about a dragon.")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "warning: the answer reached --max-tokens 5 before it ended; it is shown as it " \
        "stands" in r.stderr, r.stderr
    assert r.stdout.strip(), r.stdout  # what it wrote is still shown
    r = run("--tools", str(ROOT / "examples/echo.json"), "--max-tokens", "64", "--max-steps",
            "1", "--tool-choice", "none", "--single", "Say hi.")
    assert r.returncode == 0 and "warning" not in r.stderr, (r.returncode, r.stderr)


@pytest.mark.parametrize("choice, message", [
    # both said "tool_choice names ''", the library's field, after the model had loaded
    ("", "--tool-choice '' has an empty step"),
    ("echo,,none", "--tool-choice 'echo,,none' has an empty step"),
    ("ecko", "--tool-choice names 'ecko', which is not a tool here (tools: echo)"),
])
def test_a_tool_choice_that_names_no_tool_is_a_usage_error(choice, message):
    r = run("--tools", str(ROOT / "examples/echo.json"), "--tool-choice", choice, "--single", "hi")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"mlx_agent: error: {message}"), r.stderr
    assert r.stderr.count("\n") == 1, r.stderr


def test_a_required_tool_choice_without_tools_is_a_usage_error(tmp_path):
    # "tool_choice 'required' needs at least one tool", the library's field, once the model
    # had loaded
    empty = tmp_path / "none.json"
    empty.write_text("[]")
    r = run("--tools", str(empty), "--tool-choice", "auto,required", "--single", "hi")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr == "mlx_agent: error: --tool-choice required needs a tool, and there is " \
        "none here; give --tools, or use auto or none\n", r.stderr
