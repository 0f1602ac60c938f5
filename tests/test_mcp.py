"""Tools from MCP servers: a real server written with the SDK (tests/mcp_server.py), real
subprocesses, the real bundled model for the end-to-end call."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import msgspec
import pytest

from mlx_agent.agent import events as ev
from mlx_agent.tools import run_tool
from mlx_agent.tools.mcp import McpError, McpServers, ServerSpec, load_config, spec_from_command
from mlx_agent.tools.sandbox import Sandbox, unavailable

from .conftest import pid_alive, wait_for_line

ROOT = Path(__file__).resolve().parent.parent
SERVER = Path(__file__).resolve().parent / "mcp_server.py"
CLI = [sys.executable, "-m", "mlx_agent.cli.main"]


PIDS: list[Path] = []  # where the current test's servers write their pids


def server(mode: str = "ok") -> str:
    return f"{sys.executable} {SERVER} {mode}" + (f" {PIDS[-1]}" if PIDS else "")


def cli(*args, env=None, timeout=120):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=ROOT)


def assert_gone(pidfile: Path, within: float = 5.0) -> None:
    pids = [int(p) for p in pidfile.read_text().split()]
    assert pids
    deadline = time.monotonic() + within
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if pid_alive(p)]


@pytest.fixture
def pidfile(tmp_path):
    PIDS.append(tmp_path / "pids")
    yield PIDS[-1]
    PIDS.clear()


def by_name(servers):
    tools, warnings = servers.tools()
    return {t.name: t for t in tools}, warnings


def test_listing_calls_errors_summaries_and_cap(pidfile):
    with McpServers([spec_from_command(server())], cap=16) as servers:
        tools, warnings = by_name(servers)
        assert set(tools) == {"add", "fail", "crash", "slow", "shell", "connect", "stray",
                              "picture"}
        assert tools["add"].signature() == "add(a: integer, b: integer)"
        assert tools["add"].description == "Add two integers."
        assert servers.origin["add"] == "mcp_server"
        # the schema that fails our checks is left out, reported with server and tool
        assert len(warnings) == 1 and "'mcp_server'" in warnings[0] \
            and "'broken'" in warnings[0] and "parameters.properties.x.type" in warnings[0]
        ok = run_tool(tools["add"], {"a": 2, "b": 40})
        assert (ok.stdout, ok.exit_code, ok.tool) == ("42", 0, "add")
        failed = run_tool(tools["fail"], {})
        assert failed.exit_code == 1 and "fail" in failed.stdout
        picture = run_tool(tools["picture"], {})  # "[image/png, 100 bytes]", capped at 16
        assert picture.exit_code == 0 and picture.stdout.startswith("[image/")
        assert "…[truncated 6 bytes]" in picture.stdout and picture.stdout.endswith("bytes]")
    assert_gone(pidfile)


@pytest.fixture
def http_server(tmp_path):
    """tests/mcp_server.py over Streamable HTTP on a free 127.0.0.1 port; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(SERVER), "http", str(tmp_path / "pids"),
                             str(port)], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait()


def test_streamable_http_server_by_url(http_server):
    with McpServers([ServerSpec(name="web", url=http_server)]) as servers:
        tools, _ = by_name(servers)
        assert servers.origin["add"] == "web"
        r = run_tool(tools["add"], {"a": 20, "b": 22})
        assert (r.stdout, r.exit_code) == ("42", 0)
        assert run_tool(tools["fail"], {}).exit_code == 1


def test_an_http_server_that_is_not_there_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"web": {"url": f"http://127.0.0.1:{port}/mcp"}}}))
    r = cli("tools", "ls", "--mcp-config", str(config), env={"MLX_AGENT_MCP_START_TIMEOUT": "5"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "MCP server 'web'" in r.stderr


@pytest.mark.skipif(unavailable("bwrap") is not None, reason="needs a working bwrap")
@pytest.mark.parametrize("network", [False, True])
def test_a_sandboxed_server_has_the_network_only_when_its_config_says_so(network):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        spec = msgspec.structs.replace(spec_from_command(server()), network=network)
        with McpServers([spec], sandbox=Sandbox("bwrap")) as servers:
            tools, _ = by_name(servers)
            r = run_tool(tools["connect"], {"port": listener.getsockname()[1]})
    assert r.exit_code == 0
    assert r.stdout == "connected" if network else r.stdout.startswith("refused")


@pytest.mark.skipif(unavailable("bwrap") is not None, reason="needs a working bwrap")
def test_a_sandboxed_server_cannot_leave_what_acts_on_the_host_later(tmp_path):
    """A hostile tester's breach: a stdio server under bwrap wrote the root repository's
    config (a command git runs) and left a setuid shell and a new repository behind."""
    root = tmp_path / "root"
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    config = (root / ".git" / "config").read_text()
    # in the root: a clone under /tmp (CI's) is hidden by the sandbox's private /tmp
    (root / "server.py").write_text(Path(SERVER).read_text())
    with McpServers([spec_from_command(f"{sys.executable} {root / 'server.py'}")],
                    sandbox=Sandbox("bwrap"), cwd=str(root)) as servers:
        tools, _ = by_name(servers)
        r = run_tool(tools["shell"], {"command": "echo '[core] fsmonitor = x' >> .git/config"})
        assert "Read-only file system" in r.stdout, r
        r = run_tool(tools["shell"], {"command": "cp /bin/true t && chmod 4755 t && "
                                                 "mkdir -p n/.git && echo made"})
        assert "exit 0 made" in r.stdout and "sandbox: " in r.stderr, r
        assert not (root / "t").stat().st_mode & 0o4000 and not (root / "n" / ".git").exists()
        run_tool(tools["shell"], {"command": "(sleep 0.5; cp /bin/true u && chmod 4755 u) &"})
        time.sleep(1.0)  # left between calls: undone when the server closes
    assert not (root / "u").stat().st_mode & 0o4000
    assert (root / ".git" / "config").read_text() == config


@pytest.mark.skipif(unavailable("bwrap") is not None, reason="needs a working bwrap")
def test_a_sandboxed_server_that_locks_its_root_gives_it_back(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "server.py").write_text(Path(SERVER).read_text())
    with McpServers([spec_from_command(f"{sys.executable} {root / 'server.py'}")],
                    sandbox=Sandbox("bwrap"), cwd=str(root)) as servers:
        tools, _ = by_name(servers)
        r = run_tool(tools["shell"], {"command": "chmod 000 ."})
        assert f"sandbox: gave {root} back its owner's permissions (the tool had left it at " \
               "mode 0000)" in r.stderr, r
        assert root.stat().st_mode & 0o700 == 0o700


def test_a_call_slower_than_the_timeout_is_a_timed_out_result(pidfile):
    with McpServers([spec_from_command(server())], call_timeout=0.5) as servers:
        tools, _ = by_name(servers)
        start = time.monotonic()
        r = run_tool(tools["slow"], {"seconds": 5})
        assert r.exit_code == 1 and "'mcp_server'" in r.stderr and "timed out" in r.stderr
        assert r.timed_out  # the event and the trajectory say so too (the SDK's own timeout)
        assert time.monotonic() - start < 4
        assert run_tool(tools["add"], {"a": 1, "b": 1}).stdout == "2"  # still serving
    assert_gone(pidfile)


def test_a_line_that_is_not_utf8_on_a_servers_stdout_is_skipped_not_fatal(pidfile):
    """One byte that was not UTF-8 stopped the SDK's reader for good: start-up waited out
    its timeout, and every call after such a line waited out --tool-timeout."""
    with McpServers([spec_from_command(server("latin1"))], start_timeout=30,
                    call_timeout=30) as servers:  # the banner came before the handshake
        tools, _ = by_name(servers)
        start = time.monotonic()
        assert run_tool(tools["stray"], {}).stdout == "answered"
        assert run_tool(tools["add"], {"a": 1, "b": 2}).stdout == "3"
        assert time.monotonic() - start < 20
    assert_gone(pidfile)


def test_a_server_that_crashes_mid_call_gives_tool_errors_not_exceptions(pidfile):
    with McpServers([spec_from_command(server())]) as servers:
        tools, _ = by_name(servers)
        crashed = run_tool(tools["crash"], {})
        assert crashed.exit_code == 1 and "MCP server 'mcp_server'" in crashed.stderr
        after = run_tool(tools["add"], {"a": 1, "b": 2})
        assert after.exit_code != 0 and "'mcp_server'" in after.stderr
    assert_gone(pidfile)


def test_colliding_names_get_their_server_prefix(tmp_path):
    tools_file = tmp_path / "tools.json"
    tools_file.write_text(json.dumps([{"name": "slow", "_exec": "sleep 0"}]))
    r = cli("tools", "ls", "--tools", str(tools_file), "--mcp", server(),
            "--mcp", server("second"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "mcp_server__add(a: integer, b: integer)  Add two integers.  [mcp:mcp_server]" \
        in lines
    assert "mcp_server_2__add(a: integer, b: integer)  Add as the second server does.  " \
           "[mcp:mcp_server_2]" in lines
    assert f"slow()  [{tools_file}]" in lines  # the file's tool keeps its name
    assert "mcp_server__slow(seconds: number)  Sleeps.  [mcp:mcp_server]" in lines
    assert "fail()  Always fails.  [mcp:mcp_server]" in lines  # offered once: unprefixed
    assert "'broken'" in r.stderr and "'mcp_server'" in r.stderr


def test_a_prefixed_name_that_is_taken_too_is_left_out_not_shadowed(tmp_path):
    tools_file = tmp_path / "tools.json"  # the server's add would become mcp_server__add
    tools_file.write_text(json.dumps([{"name": "add", "_exec": "echo file"},
                                      {"name": "mcp_server__add", "_exec": "echo file"}]))
    r = cli("tools", "ls", "--tools", str(tools_file), "--mcp", server())
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line for line in lines if line.startswith("mcp_server__add(")] == \
        [f"mcp_server__add()  [{tools_file}]"], lines  # listed once, as the file's
    assert "tool 'add' would be named 'mcp_server__add', which another tool has; left out" \
        in r.stderr, r.stderr


def test_config_file_names_servers_and_passes_env_and_cwd(tmp_path, pidfile):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"calc": {
        "command": sys.executable, "args": [str(SERVER), "second", "pids"],
        "cwd": str(tmp_path), "env": {"UNUSED": "1"}}}}))
    specs = load_config(config)
    assert [(s.name, s.cwd) for s in specs] == [("calc", str(tmp_path))]
    r = cli("tools", "ls", "--mcp-config", str(config), "--sandbox", "none")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["add(a: integer, b: integer)  Add as the second server "
                                     "does.  [mcp:calc]"]
    assert_gone(pidfile)  # a relative path: the server ran in the config's cwd


@pytest.mark.parametrize("content,message", [
    ("{", "not valid JSON"),
    ('{"servers": {}}', 'expected {"mcpServers"'),
    ('{"mcpServers": {"x": {"args": []}}}', "server 'x' needs exactly one of"),
    ('{"mcpServers": {"x": {"command": 3}}}', "server 'x'"),
])
def test_bad_config_is_one_line(tmp_path, content, message):
    config = tmp_path / "mcp.json"
    config.write_text(content)
    r = cli("tools", "ls", "--mcp-config", str(config))
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_a_config_past_the_size_limit_is_one_line(tmp_path):
    config = tmp_path / "mcp.json"
    with open(config, "wb") as f:
        f.truncate(3 << 30)  # sparse: it was read whole, 3 GB of memory
    r = cli("tools", "ls", "--mcp-config", str(config))
    assert r.returncode == 2 and r.stderr == (
        f"mlx_agent: error: cannot read MCP config {config}: it is {3 << 30:,} bytes, over the "
        "1 MiB limit\n"), r.stderr


def test_a_server_that_exits_at_start_is_one_line_naming_it(pidfile):
    r = cli("tools", "ls", "--mcp", server("exit"), "--sandbox", "none")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [
        "mlx_agent: error: MCP server 'mcp_server' failed to start (MCPError: Connection "
        "closed); its stderr: cannot open the database"]
    assert_gone(pidfile)


def test_a_server_that_hangs_at_start_times_out_and_is_killed(pidfile):
    start = time.monotonic()
    r = cli("tools", "ls", "--mcp", server(), "--mcp", server("hang"), "--sandbox", "none",
            env={"MLX_AGENT_MCP_START_TIMEOUT": "4"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "MCP server 'mcp_server_2' did not start within 4 s; its stderr: waiting for " \
           "something that never comes" in r.stderr
    assert time.monotonic() - start < 60  # the server would sleep 600 s (slack for a loaded machine)
    assert_gone(pidfile)  # the healthy one as well


def test_start_failure_in_process_raises_mcp_error(pidfile):
    with pytest.raises(McpError, match="'mcp_server' did not start within 2 s"):
        McpServers([spec_from_command(server("hang"))], start_timeout=2).start()
    assert_gone(pidfile)


def test_ctrl_c_stops_every_server(pidfile):
    # SIGINT handled in the child even when the tests run as a background job (which starts
    # with it ignored: the agent would then read EOF and exit 0)
    proc = subprocess.Popen([*CLI, "agent", "--sandbox", "none", "--mcp", server(),
                             "--mcp", server("second")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT, env=dict(os.environ),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 30
    while (not pidfile.exists() or len(pidfile.read_text().split()) < 2) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # both handshakes done: the agent is loading the model or reading
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and b"Traceback" not in err, err
    assert_gone(pidfile)


@pytest.mark.real_model
def test_forced_call_end_to_end_through_the_agent():
    """Under the default sandbox (bwrap here): the server runs confined."""
    r = cli("agent", "--mcp", server(), "--single", "What is 2 plus 3?", "--json-out",
            "--tool-choice", "add,none", "--max-tokens", "48", "--max-steps", "2", timeout=300)
    assert r.returncode in (0, 1), r.stderr
    events = [ev.decode(line) for line in r.stdout.splitlines()]
    calls = [e for e in events if isinstance(e, ev.ToolCall)]
    assert len(calls) == 1 and calls[0].tool == "add" and calls[0].exit_code == 0
    args = calls[0].arguments
    assert calls[0].stdout == str(args["a"] + args["b"])
    assert isinstance(events[-1], ev.Stats) and events[-1].calls == 1


@pytest.mark.parametrize("args,env,message", [
    (["--mcp", "'unclosed"], {}, "--mcp \"'unclosed\": No closing quotation"),
    (["--mcp", " "], {}, "--mcp needs a command"),
    (["--mcp", "/no/such/server"], {}, "MCP server 'server' failed to start (FileNotFoundError"),
    (["--mcp", "true"], {"MLX_AGENT_MCP_START_TIMEOUT": "soon"},
     "$MLX_AGENT_MCP_START_TIMEOUT must be a number of seconds above 0, not 'soon'"),
])
def test_bad_mcp_options_are_one_line(args, env, message):
    r = cli("tools", "ls", "--sandbox", "none", *args, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlx_agent: error: ") and message in lines[0]


def test_synth_takes_a_servers_tools_and_runs_them_for_results(tmp_path, pidfile):
    out = tmp_path / "tasks"
    r = cli("synth", "--mcp", server("second"), "--out", str(out), "--n-train", "6",
            "--n-heldout", "3", "--seed", "1", "--sandbox", "none")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert json.loads((out / "tools.json").read_text()) == []  # the server's tools stay its
    tasks = [json.loads(line) for f in ("train.jsonl", "heldout.jsonl")
             for line in (out / f).read_text().splitlines()]
    assert len(tasks) == 9 and {t["tools"] for t in tasks} == {"tools.json"}
    called = [c for t in tasks for c in t["check"].get("tool_calls") or []]
    assert called and {c["name"] for c in called} == {"add"}
    # an answer task states the result the server gave (run through tools/call)
    answers = [t["check"]["answer_pattern"] for t in tasks if "answer_pattern" in t["check"]]
    assert answers and all(r"second\ " in a for a in answers), answers
    assert_gone(pidfile)


def test_synth_without_any_tool_source_is_a_usage_error(tmp_path):
    r = cli("synth", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "give --tools FILE, or MCP servers with --mcp / --mcp-config" in r.stderr


@pytest.mark.real_model
def test_eval_adds_a_servers_tools_to_every_task_prefixed_on_a_clash(tmp_path, pidfile):
    """The tasks' own tools file defines ``add`` too: the server's gets its server's name."""
    (tmp_path / "tools.json").write_text(json.dumps([{
        "type": "function", "function": {"name": "add", "description": "Adds locally.",
                                         "parameters": {"type": "object", "properties": {}}},
        "_exec": "echo local"}]))
    task = {"prompt": "What is 2 plus 3?", "tools": "tools.json",
            "tool_choice": [{"name": "mcp_server__add", "arguments": {"a": 2, "b": 3}}, "none"],
            "check": {"tool_calls": [{"name": "mcp_server__add", "arguments": {"a": 2, "b": 3}}]}}
    (tmp_path / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    r = cli("eval", "--tasks", str(tmp_path / "tasks.jsonl"), "--mcp", server("second"),
            "--max-tokens", "32", "--max-steps", "2", "--trajectory-dir", str(tmp_path / "runs"),
            "--sandbox", "none", timeout=300)  # unconfined: the server writes its pid file
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout.splitlines()[-1].split()[:2] == ["1", "100%"], r.stdout
    (traj,) = (tmp_path / "runs").glob("*.atraj")
    assert "second 5" in traj.read_text(errors="replace")  # the server's answer, not "local"
    assert_gone(pidfile)


@pytest.mark.parametrize("config,message", [
    ({"a/b": {"command": "true"}}, "MCP server 'a/b' failed to start"),  # a path in a name
    ({"yes": {"command": "yes", "args": ["garbage"]}}, "MCP server 'yes' did not start"),
])
def test_a_server_that_cannot_start_is_one_line_whatever_it_prints(tmp_path, config, message):
    """A server that writes lines that are not JSON-RPC made the SDK log a traceback for
    each (950,000 lines in 20 s); a name with a slash was a FileNotFoundError."""
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": config}))
    r = cli("tools", "ls", "--mcp-config", str(path), env={"MLX_AGENT_MCP_START_TIMEOUT": "2"})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, \
        r.stderr[-500:]


ENDLESS_PAGES = r"""
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    if msg["method"] == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"],
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "raw", "version": "0"}}
    else:  # tools/list: a page of 500, and always another
        result = {"tools": [{"name": f"t{i}", "inputSchema": {"type": "object"}}
                            for i in range(500)], "nextCursor": "again"}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""


def test_a_server_listing_tools_without_end_is_refused_at_once(tmp_path):
    # it paged until the start-up timeout, its memory growing all the while
    script = tmp_path / "endless.py"
    script.write_text(ENDLESS_PAGES)
    start = time.monotonic()
    r = cli("tools", "ls", "--mcp", f"{sys.executable} {script}", "--sandbox", "none",
            env={"MLX_AGENT_MCP_START_TIMEOUT": "60"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [
        "mlx_agent: error: MCP server 'endless' failed to start (TooManyTools: it lists more "
        "than 4096 tools; serve fewer)"], r.stderr
    assert time.monotonic() - start < 50


def test_ctrl_c_during_a_batched_runs_call_ends_it_at_once(tmp_path, pidfile):
    """eval --batch runs each task on a worker thread, which no signal reaches: Ctrl-C
    waited for the workers' MCP calls to reach their 30 s timeout."""
    calls = tmp_path / "calls"
    (tmp_path / "none.json").write_text('{"tools": []}')
    forced = {"name": "shell", "arguments": {"command": f"echo $$ >> '{calls}'; exec sleep 300"}}
    task = {"prompt": "Wait.", "tools": "none.json", "tool_choice": forced,
            "check": {"answer_pattern": "done"}}
    (tmp_path / "tasks.jsonl").write_text((json.dumps(task) + "\n") * 4)
    proc = subprocess.Popen([*CLI, "eval", "--tasks", str(tmp_path / "tasks.jsonl"), "--batch",
                             "2", "--max-steps", "2", "--sandbox", "none", "--mcp", server()],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=dict(os.environ),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    wait_for_line(calls, proc)  # a call runs
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err
    took = time.monotonic() - start
    assert took < 20, took  # at once, give or take a loaded machine; it was 30 s
    assert_gone(pidfile)
    assert_gone(calls)


def test_a_call_that_fails_with_its_own_timeout_error_is_not_waited_on():
    """A call whose coroutine raised TimeoutError (a socket's, anyio's) read as "not done
    yet": the wait spun a core until call_timeout + 5 s before reporting it."""
    import concurrent.futures
    import time

    from mlx_agent.tools.mcp import _result

    future = concurrent.futures.Future()
    future.set_exception(TimeoutError("the server's socket timed out"))
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="socket timed out"):
        _result(future, 30)
    assert time.monotonic() - start < 5


FLOOD = r"""
import json, os, sys, time
when = sys.argv[1]  # the request it floods stdout at instead of answering; "stderr"; "big"
with open(sys.argv[2], "a") as f:
    f.write(f"{os.getpid()}\n")
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == when:  # 256 MiB without a newline, then silence
        for _ in range(4096):
            os.write(1, b"x" * 65536)
        time.sleep(600)
    if when == "stderr" and msg.get("method") == "initialize":  # 64 MiB, then its last words
        for _ in range(1024):
            os.write(2, b"y" * 65535 + b"\n")
        print("last words", file=sys.stderr, flush=True)
    if "id" not in msg:
        continue
    if msg["method"] == "tools/call":  # "big": 20 MiB of text, in one line
        result = {"content": [{"type": "text", "text": "<" + "z" * (20 << 20) + ">"}]}
    elif msg["method"] == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"],
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "raw", "version": "0"}}
    else:
        result = {"tools": [{"name": "flood", "description": "Floods.",
                             "inputSchema": {"type": "object"}}]}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""
FLOODED = "MCP server 'flood' wrote a message over 32 MiB without a newline; it was stopped"


def flood_server(tmp_path, when: str) -> str:
    script = tmp_path / "flood.py"
    script.write_text(FLOOD)
    return f"{sys.executable} {script} {when} {tmp_path / 'flood.pids'}"


def test_a_server_writing_without_newlines_is_stopped_at_the_limit(tmp_path, pidfile):
    """The SDK's reader kept the line growing (and re-scanned it) until the call's timeout: a
    fast writer could fill memory first."""
    specs = [spec_from_command(flood_server(tmp_path, "tools/call")),
             spec_from_command(server("second"))]
    with McpServers(specs, call_timeout=60) as servers:
        tools, _ = by_name(servers)
        start = time.monotonic()
        r = run_tool(tools["flood"], {})
        assert (r.exit_code, r.stderr, r.timed_out) == (1, FLOODED, False), r
        assert time.monotonic() - start < 30  # not the call's 60 s timeout
        assert_gone(tmp_path / "flood.pids")  # at once, not when the session closes
        again = run_tool(tools["flood"], {})
        assert again.exit_code != 0 and again.stderr.endswith(FLOODED)  # still says why
        assert run_tool(tools["add"], {"a": 1, "b": 2}).stdout == "second 3"  # the other serves
    assert_gone(pidfile)


def test_a_big_result_under_the_limit_arrives_whole(tmp_path):
    with McpServers([spec_from_command(flood_server(tmp_path, "big"))], cap=16) as servers:
        r = run_tool(by_name(servers)[0]["flood"], {})
    assert r.exit_code == 0  # ends and middle of 20 MiB, read over many reads of the pipe
    assert r.stdout == f"<zzzzzzz…[truncated {(20 << 20) - 14} bytes]zzzzzzz>"


def test_a_server_flooding_before_it_answers_initialize_is_one_line(tmp_path):
    start = time.monotonic()
    r = cli("tools", "ls", "--mcp", flood_server(tmp_path, "initialize"), "--sandbox", "none",
            env={"MLX_AGENT_MCP_START_TIMEOUT": "60"})
    assert r.returncode == 2 and r.stderr == f"mlx_agent: error: {FLOODED}\n", r.stderr[-500:]
    assert time.monotonic() - start < 45  # not the 60 s start-up timeout
    assert_gone(tmp_path / "flood.pids")


@pytest.mark.real_model
def assert_the_agent_goes_on_after_a_flooded_call(server: list[str], message: str) -> None:
    """The agent, forced to call the flooding server's tool once: that call fails with
    ``message`` at once (not at its 100 s timeout) and the run goes on to its stats."""
    start = time.monotonic()
    r = cli("agent", *server, "--single", "Flood.", "--json-out", "--tool-choice",
            "flood,none", "--tool-timeout", "100", "--max-tokens", "16", "--max-steps", "2",
            timeout=300)
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr[-500:]
    events = [ev.decode(line) for line in r.stdout.splitlines()]
    calls = [e for e in events if isinstance(e, ev.ToolCall)]
    assert [(c.tool, c.exit_code, c.stderr) for c in calls] == [("flood", 1, message)]
    assert isinstance(events[-1], ev.Stats)  # the run went on to its answer
    assert time.monotonic() - start < 80  # not the call's 100 s timeout


def test_the_agent_goes_on_after_a_server_that_floods_its_call(tmp_path):
    assert_the_agent_goes_on_after_a_flooded_call(
        ["--mcp", flood_server(tmp_path, "tools/call"), "--sandbox", "none"], FLOODED)
    assert_gone(tmp_path / "flood.pids")


def test_a_servers_stderr_is_kept_as_its_tail_not_a_file_without_end(tmp_path, monkeypatch):
    """Its stderr went to a temporary file that grew as long as it wrote (even from inside
    the sandbox); only its last line was ever read."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with McpServers([spec_from_command(flood_server(tmp_path, "stderr"))]) as servers:
        tools, _ = by_name(servers)
        assert set(tools) == {"flood"}  # 64 MiB of stderr did not stop it
        assert servers.servers["flood"].last_stderr() == "last words"
        written = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
        assert written < 1 << 20, written
    assert_gone(tmp_path / "flood.pids")


class RawHttpMcp(http.server.BaseHTTPRequestHandler):
    """A Streamable HTTP MCP server written by hand, so that it can misbehave: it answers each
    request in JSON (``tools/call`` as an event stream when ``self.server.sse``), and answers
    the request named ``self.server.flood`` with 128 MiB that never end a message (a JSON body,
    the same gzipped, or one server-sent event), then waits for the client to hang up. Its
    ``tools/call`` result is ``self.server.text``."""

    def do_POST(self):
        msg = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "id" not in msg:
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if msg["method"] == self.server.flood:
            return self.flood(self.server.kind)
        if msg["method"] == "initialize":
            result = {"protocolVersion": msg["params"]["protocolVersion"],
                      "capabilities": {"tools": {}}, "serverInfo": {"name": "raw", "version": "0"}}
        elif msg["method"] == "tools/list":
            result = {"tools": [{"name": "flood", "description": "Floods.",
                                 "inputSchema": {"type": "object"}}]}
        else:
            result = {"content": [{"type": "text", "text": self.server.text}]}
        body = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode()
        sse = self.server.sse and msg["method"] == "tools/call"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if sse else "application/json")
        self.end_headers()
        self.wfile.write(b"event: message\ndata: " + body + b"\n\n" if sse else body)

    def flood(self, kind):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if kind == "sse" else
                         "application/json")
        if kind == "gzip":  # 130 KiB on the wire, 128 MiB once decoded
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        head = b"event: message\ndata: " if kind == "sse" else b'{"jsonrpc": "2.0", "result": "'
        gzip = zlib.compressobj(wbits=31) if kind == "gzip" else None
        try:
            for i in range(128):
                data = (head if i == 0 else b"") + b"x" * (1 << 20)
                self.wfile.write(gzip.compress(data) + gzip.flush(zlib.Z_SYNC_FLUSH)
                                 if gzip else data)
            self.wfile.flush()
            self.connection.settimeout(120)
            while self.connection.recv(1 << 16):  # until the client hangs up
                pass
        except OSError:
            pass

    def do_GET(self):  # no stream of the server's own
        self.send_response(405)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_DELETE = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def raw_http():
    """Starts a :class:`RawHttpMcp` on a free port: ``raw_http(flood=, kind=, sse=, text=)``
    gives its URL."""
    started = []

    def start(flood="", kind="json", sse=False, text="answered"):
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RawHttpMcp)
        httpd.handle_error = lambda *args: None  # a client that hangs up mid-answer
        httpd.flood, httpd.kind, httpd.sse, httpd.text = flood, kind, sse, text
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        started.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}/mcp"

    yield start
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


HTTP_FLOODED = "MCP server 'web' sent a message over 32 MiB; it was disconnected"


@pytest.mark.parametrize("kind", ["json", "gzip", "sse"])
def test_an_http_server_flooding_a_call_is_disconnected_at_the_limit(raw_http, kind):
    """The SDK read a JSON body whole (and a gzipped one decoded whole) until the call's
    timeout, memory growing all the while; an event over 1 MiB failed its call alone."""
    specs = [ServerSpec(name="web", url=raw_http(flood="tools/call", kind=kind)),
             ServerSpec(name="calm", url=raw_http())]
    with McpServers(specs, call_timeout=60) as servers:
        tools = {t.name: t for t in servers.tools()[0]}
        start = time.monotonic()
        r = run_tool(tools["web__flood"], {})
        assert (r.exit_code, r.stderr, r.timed_out) == (1, HTTP_FLOODED, False), r
        assert time.monotonic() - start < 30  # not the call's 60 s timeout
        again = run_tool(tools["web__flood"], {})
        assert again.exit_code != 0 and again.stderr.endswith(HTTP_FLOODED), again
        assert run_tool(tools["calm__flood"], {}).stdout == "answered"  # the other serves


@pytest.mark.parametrize("kind", ["json", "gzip", "sse"])
def test_an_http_server_flooding_initialize_is_one_line(tmp_path, raw_http, kind):
    config = tmp_path / "web.json"
    config.write_text(json.dumps({"mcpServers": {"web": {"url": raw_http("initialize", kind)}}}))
    start = time.monotonic()
    r = cli("tools", "ls", "--mcp-config", str(config), env={"MLX_AGENT_MCP_START_TIMEOUT": "60"})
    assert r.returncode == 2 and r.stderr == f"mlx_agent: error: {HTTP_FLOODED}\n", r.stderr
    assert time.monotonic() - start < 45  # not the 60 s start-up timeout


@pytest.mark.parametrize("sse", [False, True])
def test_a_big_http_result_under_the_limit_arrives_whole(raw_http, sse):
    """An event over 1 MiB (the SDK's own limit) failed its call: a big result came over stdio
    but not over HTTP."""
    text = "<" + "z" * (20 << 20) + ">"
    with McpServers([ServerSpec(name="web", url=raw_http(sse=sse, text=text))],
                    cap=16) as servers:
        r = run_tool(by_name(servers)[0]["flood"], {})
    assert r.exit_code == 0, r  # ends and middle of 20 MiB, in one message
    assert r.stdout == f"<zzzzzzz…[truncated {(20 << 20) - 14} bytes]zzzzzzz>"


@pytest.mark.real_model
def test_the_agent_goes_on_after_an_http_server_floods_its_call(tmp_path, raw_http):
    config = tmp_path / "web.json"
    config.write_text(json.dumps({"mcpServers": {"web": {"url": raw_http("tools/call")}}}))
    assert_the_agent_goes_on_after_a_flooded_call(["--mcp-config", str(config)], HTTP_FLOODED)
