"""`eval --ray` on a real local Ray cluster (2 CPUs, started once for the module) with a tiny
random model: the same rows and trajectories as a local run, workers killed mid-run, an
unreachable address. Every run is the real command line in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from mlx_agent import trajectory as tj  # noqa: E402
from mlx_agent.fanout import FanoutError, connect  # noqa: E402
from mlx_agent.models import tinygpt_format  # noqa: E402

from .conftest import random_tinygpt_file  # noqa: E402

RAY = Path(sys.executable).parent / "ray"
TOOLS = [{"name": "echo", "description": "Echo text", "_exec": 'printf "%s" "$text"',
          "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                         "required": ["text"]}}]
# ray imported or not, said on stderr after the command ran
NO_RAY_PROBE = ("import sys\nfrom mlx_agent.cli.main import main\ntry:\n    main(sys.argv[1:])\n"
                "finally:\n    print('ray imported' if 'ray' in sys.modules else 'no ray',"
                " file=sys.stderr)\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """A head node with 2 CPUs, stopped (its process group) when the module ends. It uses
    Ray's token authentication (as the README advises), with a token in a home of its own
    that every command here shares, so no ~/.ray of the user's changes what runs."""
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths live here
    saved = {k: os.environ.get(k) for k in ("HOME", "RAY_AUTH_MODE")}
    os.environ.update(HOME=tmp, RAY_AUTH_MODE="token")
    (Path(tmp) / ".ray").mkdir()
    (Path(tmp) / ".ray" / "auth_token").write_text(os.urandom(16).hex())
    log = Path(tmp) / "head.log"
    port = _free_port()
    cmd = [str(RAY), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
           "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={tmp}"]
    with open(log, "w") as out:
        head = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "block forever" not in log.read_text():
            assert head.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        head.terminate()  # --block stops the processes it started
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def task_set(tmp_path_factory):
    """A tiny byte-level model and a task set: tool calls, answers, a fixture."""
    d = tmp_path_factory.mktemp("fanout")
    tinygpt_format.write(d / "tiny.tinygpt", random_tinygpt_file(
        config={"layers": 2, "dModel": 32, "ctx": 2048, "heads": 4, "dMlp": 64}))
    (d / "tools.json").write_text(json.dumps(TOOLS))
    (d / "fx").mkdir()
    (d / "fx" / "seed.txt").write_text("x")
    return d


def _write_tasks(d: Path, tasks: list[dict]) -> Path:
    path = d / f"tasks-{len(list(d.glob('tasks-*')))}.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def _eval(d: Path, tasks: Path, tmp: Path, *extra: str, probe: bool = False):
    args = ["eval", str(d / "tiny.tinygpt"), "--tasks", str(tasks), "--sandbox", "none",
            "--max-tokens", "12", "--max-steps", "2", "--out", str(tmp / "runs.jsonl"),
            "--trajectory-dir", str(tmp / "traj"), *extra]
    cmd = [sys.executable, "-c", NO_RAY_PROBE, *args] if probe else \
        [sys.executable, "-m", "mlx_agent.cli.main", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


def _rows(tmp: Path) -> list[dict]:
    rows = [json.loads(line) for line in (tmp / "runs.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def _trajectories(tmp: Path) -> list:
    """Each trajectory as what it means: its task, tokens (replayed), sampled ids, texts and
    reward. Which ids a step fed depends on what the engine had cached, not on the run."""
    return sorted((t.task, json.dumps(t.sampling, sort_keys=True), t.replay(),
                   [(s.role, s.content, s.output_ids) for s in t.steps], t.summary["reward"])
                  for _, t in tj.iter_dir(tmp / "traj"))


def test_eval_on_ray_matches_a_local_run(cluster, task_set, tmp_path):
    tasks = _write_tasks(task_set, [
        {"id": f"echo-{i}", "prompt": f"echo {i}", "tools": "tools.json",
         "check": {"tool_calls": [{"name": "echo"}]}} for i in range(4)] + [
        {"id": "answer", "prompt": "capital?", "tools": "tools.json",
         "check": {"answer_pattern": "."}},
        {"id": "files", "prompt": "write", "builtin_tools": True, "fixture": "fx",
         "check": {"shell": "test -f seed.txt"}}])
    local, remote = tmp_path / "local", tmp_path / "ray"
    r = _eval(task_set, tasks, local, "--seeds", "2", probe=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[-1] == "no ray"  # without --ray, Ray is never imported
    r = _eval(task_set, tasks, remote, "--seeds", "2", "--ray", cluster)
    assert r.returncode == 0, r.stderr
    assert _rows(remote) == _rows(local) and len(_rows(local)) == 12
    assert [row["task"] for row in _rows(local)][:3] == ["echo-0", "echo-0", "echo-1"]
    assert _trajectories(remote) == _trajectories(local)
    done = [line for line in r.stderr.splitlines() if line.endswith(" done]")]
    assert len(done) == 12  # each run's line names its worker (the first one up may take all)
    # each worker taking 3 runs at once, decoded in one batch: the same runs
    batched = tmp_path / "ray-batched"
    r = _eval(task_set, tasks, batched, "--seeds", "2", "--ray", cluster, "--batch", "3")
    assert r.returncode == 0, r.stderr
    assert _rows(batched) == _rows(local) and _trajectories(batched) == _trajectories(local)


def test_dead_workers_tasks_run_elsewhere_then_fail(cluster, task_set, tmp_path):
    """A check that kills its worker once (its run is finished by another), and one that
    kills every worker it runs on (recorded as failed after two re-runs)."""
    marker = tmp_path / "killed-once"
    once = f'test -e {marker} || {{ touch {marker}; kill -9 "$PPID"; }}'
    tasks = _write_tasks(task_set, [
        {"id": "a", "prompt": "echo a", "tools": "tools.json", "check": {"shell": "sleep 0.3"}},
        {"id": "once", "prompt": "x", "tools": "tools.json", "check": {"shell": once}},
        {"id": "b", "prompt": "echo b", "tools": "tools.json", "check": {"shell": "sleep 0.3"}},
        {"id": "poison", "prompt": "y", "tools": "tools.json",
         "check": {"shell": 'kill -9 "$PPID"'}},
        {"id": "c", "prompt": "echo c", "tools": "tools.json", "check": {"shell": "true"}}])
    r = _eval(task_set, tasks, tmp_path, "--ray", cluster)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    rows = _rows(tmp_path)
    assert [(x["task"], x["reward"]) for x in rows] == [
        ("a", 1.0), ("once", 1.0), ("b", 1.0), ("poison", 0.0), ("c", 1.0)]
    assert marker.exists() and all("error" not in x for x in rows if x["task"] != "poison")
    assert "died" in rows[3]["error"] and "ran 3 times" in rows[3]["error"]
    assert "poison seed 0: 0 calls, 0 turns, 0.0 s (failed: worker" in r.stderr
    assert len(list((tmp_path / "traj").glob("*.atraj"))) == 4  # none for the failed run


def test_specialize_on_ray_ships_its_tasks_and_adapter_and_gives_the_local_figures(
        cluster, task_set, tmp_path):
    """The held-out tasks and the trained adapter exist only in the driver's temporary
    directory: the workers get them packed, and score exactly what a local run scores."""
    cmd = [sys.executable, "-m", "mlx_agent.cli.main", "specialize",
           str(task_set / "tiny.tinygpt"), "--tools", str(task_set / "tools.json"),
           "--n-train", "6", "--n-heldout", "4", "--iters", "2", "--max-tokens", "12",
           "--max-steps", "2", "--sandbox", "none"]
    figures = []
    for out, extra in ((tmp_path / "local", []), (tmp_path / "ray", ["--ray", cluster])):
        r = subprocess.run(cmd + ["--out", str(out), *extra], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        saved = json.loads((out / "results.json").read_text())
        figures.append([{k: v for k, v in saved[side].items()  # cache use: per worker
                         if k not in ("seconds", "cache_share")} for side in ("before", "after")])
    assert figures[0] == figures[1] and figures[0][0]["runs"] == 4


def test_joining_a_cluster_keeps_the_callers_sigterm_handler(cluster):
    """ray.init set its own (sys.exit(15)): eval --ray exited 15 on SIGTERM, not 143, and the
    clean-up the CLI's handler starts (the runs done written, the cut ones removed) was lost."""
    script = textwrap.dedent(f"""
        import signal, sys
        from mlx_agent.fanout import connect
        def mine(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGTERM, mine)
        connect({cluster!r})
        print(signal.getsignal(signal.SIGTERM) is mine)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert r.stdout.strip() == "True", r.stderr


class _Terminated(KeyboardInterrupt):
    """What the CLI raises on SIGTERM."""


def _terminate(signum, frame):
    raise _Terminated


@pytest.mark.parametrize("sig, handler", [(signal.SIGINT, signal.default_int_handler),
                                          (signal.SIGTERM, _terminate)], ids=["int", "term"])
def test_a_ctrl_c_during_a_hand_over_never_hands_a_result_over_twice(sig, handler):
    """The race CI hit: Ctrl-C while ``on_result`` writes a row. The interrupt waits for the
    hand-over to finish, and the hand-over of what is in after it starts at the next one.
    SIGTERM too (it was not held back: a kill mid-write cut the row or handed it over twice)."""
    from types import SimpleNamespace

    from mlx_agent.fanout import _PENDING, _Run

    handed = []

    def on_result(i, result, worker):
        handed.append(i)
        if i == 0:
            os.kill(os.getpid(), sig)  # delivered before kill returns: mid-hand-over
            handed.append("rest of 0")

    run = _Run(SimpleNamespace(), ["a", "b", "c"], on_result)
    run.results = ["A", "B", _PENDING]
    # Python's own Ctrl-C handler (a background job starts with SIGINT ignored), or the CLI's
    previous = signal.signal(sig, handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run._deliver()
    finally:
        signal.signal(sig, previous)
    assert handed == [0, "rest of 0"]
    run._deliver(gaps=True)  # what run() does on the way out
    assert handed == [0, "rest of 0", 1] and run.delivered == 3


def test_packed_files_unpack_whole_and_links_or_escapes_are_refused(tmp_path):
    import io
    import tarfile

    from mlx_agent.cluster_eval import pack, unpack

    src = tmp_path / "src"
    (src / "fixture").mkdir(parents=True)
    (src / "tools.json").write_text("[]")
    (src / "fixture" / "a.txt").write_text("a")
    out = unpack(pack(src))
    assert (out / "tools.json").read_text() == "[]" and (out / "fixture" / "a.txt").read_text() \
        == "a"
    assert sorted(p.name for p in unpack(pack(src, ["tools.json"])).iterdir()) == ["tools.json"]
    for name, kind in (("../escape.txt", tarfile.REGTYPE), ("link", tarfile.SYMTYPE)):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else ""
            tar.addfile(info, io.BytesIO(b""))
        with pytest.raises(tarfile.FilterError):
            unpack(buf.getvalue())


def test_unreachable_address_is_a_one_line_error(task_set, tmp_path):
    tasks = _write_tasks(task_set, [{"id": "a", "prompt": "x", "tools": "tools.json",
                                     "check": {"answer_pattern": "."}}])
    start = time.monotonic()
    r = _eval(task_set, tasks, tmp_path, "--ray", f"127.0.0.1:{_free_port()}")
    assert r.returncode == 2 and time.monotonic() - start < 60
    assert r.stderr.startswith("mlx_agent: error: cannot reach a Ray cluster at 127.0.0.1:")
    assert len(r.stderr.splitlines()) == 1 and not (tmp_path / "runs.jsonl").exists()
    with pytest.raises(FanoutError, match="'nowhere' is not an address; give HOST:PORT"):
        connect("nowhere")


@pytest.mark.parametrize("command,extra,option", [
    ("eval", ["--mcp", "true"], "--mcp"), ("specialize", ["--mcp", "true"], "--mcp")])
def test_options_ray_does_not_take_yet_are_usage_errors(task_set, tmp_path, command, extra,
                                                          option):
    tasks = _write_tasks(task_set, [{"id": "a", "prompt": "x", "tools": "tools.json",
                                     "check": {"answer_pattern": "."}}])
    args = {"eval": ["--tasks", str(tasks)], "eval-bfcl": ["--out", str(tmp_path / "o")],
            "specialize": ["--tools", str(task_set / "tools.json"), "--out",
                           str(tmp_path / "o")]}[command]
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", command, *args,
                        "--ray", "auto", *extra], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"mlx_agent: error: {option} does not work with --ray yet; drop one of them" in r.stderr


def test_ctrl_c_stops_the_run_and_leaves_complete_files(cluster, task_set, tmp_path):
    tasks = _write_tasks(task_set, [{"id": f"slow-{i}", "prompt": f"echo {i}",
                                     "tools": "tools.json", "check": {"shell": "sleep 1"}}
                                    for i in range(8)])
    cmd = [sys.executable, "-m", "mlx_agent.cli.main", "eval", str(task_set / "tiny.tinygpt"),
           "--tasks", str(tasks), "--sandbox", "none", "--max-tokens", "12", "--max-steps", "2",
           "--out", str(tmp_path / "runs.jsonl"), "--trajectory-dir", str(tmp_path / "traj"),
           "--ray", cluster]
    # a background job starts with SIGINT ignored; the child must get the default back
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = ""
    while not seen.endswith("done]\n"):  # the first run's progress line (Ray may warn first)
        line = proc.stderr.readline()
        assert line, seen + proc.stderr.read()
        seen += line
    assert "✓ slow-0 seed 0" in seen, seen
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(60) == 130 and "Traceback" not in rest, rest
    rows = _rows(tmp_path)
    assert 1 <= len(rows) < 8 and rows[0]["task"] == "slow-0"
    trajectories = list(tj.iter_dir(tmp_path / "traj"))  # each one whole, with its reward
    assert len(trajectories) == len(rows) and all(t.summary["reward"] for _, t in trajectories)
