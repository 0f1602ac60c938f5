"""What a hostile test of the tool runtime found (issue 13, section 2), each pinned by a test:
option injection, NUL and lone surrogates, a backtracking grep, unbounded reads, symlink
races, special variable names and a write that leaves its temporary file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlx_agent.tools import ToolSchemaError, builtin_tools, load_tools, parse_tools, run_tool

EXAMPLES = Path(__file__).parent.parent / "examples"


def exec_tool(template, props=None, name="t"):
    return parse_tools(json.dumps([{"name": name, "_exec": template, "parameters": {
        "type": "object", "properties": props or {"text": {"type": "string"}}}}]))[0]


def builtins(root, **kw):
    return {t.name: t for t in builtin_tools(root, **kw)}


# -- 1. options through quoted arguments; unquoted references --------------------------

def test_the_debugger_example_ends_options(tmp_path):
    tools = {t.name: t for t in load_tools(EXAMPLES / "debugger.json")}
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir(), outside.mkdir()
    (root / "test_ok.py").write_text("def test_ok():\n    pass\n")
    (outside / "keep").mkdir()
    (outside / "keep" / "data").write_text("x")
    report = outside / "report.xml"
    for node in (f"--junitxml={report}", f"--basetemp={outside / 'keep'}"):
        r = run_tool(tools["run_test"], {"node": node}, cwd=root, timeout=60)
        assert "not found" in r.stdout, r.stdout  # a test path, not an option
    assert not report.exists() and (outside / "keep" / "data").exists()
    assert "1 passed" in run_tool(tools["run_test"], {"node": "test_ok.py::test_ok"},
                                  cwd=root, timeout=60).stdout
    r = run_tool(tools["read_file"], {"path": "--version"}, cwd=root)
    assert "No such file" in r.stderr and "coreutils" not in r.stdout
    assert all(t.warnings == () for t in tools.values())


@pytest.mark.parametrize("template,flagged", [
    ('ls $text', ["text"]),
    ('ls ${text}/x "$n"', ["text"]),
    ('echo "$(cat $text)"', ["text"]),
    ('echo "`cat $text`"', ["text"]),
    ('cat -- "$text" "${n}"', []),
    ("echo '$text'  # $text in a comment", []),
    ('grep -F "\\"$text\\"" db.jsonl', []),  # escaped quotes inside the double quotes
    ('echo $((n + 1)) $n', []),  # an integer cannot split or glob
])
def test_unquoted_references_warn_at_load(template, flagged):
    t = exec_tool(template, {"text": {"type": "string"}, "n": {"type": "integer"}})
    assert [w.split("$")[1].split(" ")[0].strip("{}") for w in t.warnings] == flagged
    assert all("tool 't'" in w and "double quotes" in w for w in t.warnings)


def test_the_agent_cli_prints_the_warning(tmp_path):
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([{"name": "lister", "_exec": "ls $dir", "parameters": {
        "type": "object", "properties": {"dir": {"type": "string"}}}}]))
    out = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "agent", str(tmp_path / "no.gguf"),
                          "--tools", str(path), "--single", "hi"],
                         capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parent.parent)
    assert "warning: " in out.stderr
    assert "tool 'lister': _exec uses $dir outside double quotes" in out.stderr


# -- 2. NUL and lone surrogates ---------------------------------------------------------

@pytest.mark.parametrize("value,message", [
    ("a\u0000b", "contains a NUL character"),
    ("a\ud800b", "is not valid Unicode"),
    ({"k": "a\udfffb"}, "is not valid Unicode"),
])
def test_unrepresentable_arguments_are_tool_errors(value, message):
    t = exec_tool('printf "%s" "$text"', {"text": {}})
    r = run_tool(t, {"text": value})
    assert r.exit_code == -1 and message in r.stderr and "'text'" in r.stderr
    json.loads(r.for_model().encode("utf-8"))


def raising_handler(text):
    raise ValueError(f"bad {text}")


def surrogate_handler(text):
    return {"echo": text}


@pytest.mark.parametrize("handler", ["raising_handler", "surrogate_handler"])
def test_handler_results_are_always_valid_text(handler):
    t = parse_tools(json.dumps([{"name": "h", "_handler": f"tests.test_tool_hardening:{handler}",
                                 "parameters": {"type": "object", "properties": {}}}]))[0]
    r = run_tool(t, {"text": "x\ud800y"})
    text = r.for_model()
    text.encode("utf-8")  # a lone surrogate would raise here, in the tokenizer, or the log
    assert "x" in text and "y" in text


def test_builtins_turn_nul_paths_into_tool_errors(tmp_path):
    tools = builtins(tmp_path)
    for name, args in [("read_file", {"path": "a\0b"}), ("grep", {"pattern": "x", "path": "a\0"}),
                       ("list_files", {"path": "\0"}), ("write_file", {"path": "a\0", "content": ""})]:
        r = run_tool(tools[name], args)
        assert r.exit_code != 0 and "NUL" in r.stderr, (name, r)


# -- 3. grep's timeout holds -------------------------------------------------------------

def test_a_backtracking_grep_times_out(tmp_path):
    (tmp_path / "dashes.txt").write_text("-" * 26 + "\n")  # (-+)+x: about 6 s in Python's re
    tools = builtins(tmp_path, timeout=1.0)
    start = time.monotonic()
    r = run_tool(tools["grep"], {"pattern": "(-+)+x"})
    assert time.monotonic() - start < 3
    assert r.timed_out and r.exit_code != 0 and "timed out after 1 s" in r.stderr


def test_grep_output_and_errors(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\r\nthree two\n")
    (tmp_path / "bin.dat").write_bytes(b"two\xff\n")  # not UTF-8: skipped, as before
    tools = builtins(tmp_path)
    assert run_tool(tools["grep"], {"pattern": "two"}).stdout == "a.txt:2: two\na.txt:3: three two"
    assert run_tool(tools["grep"], {"pattern": "nothing"}).stdout == "no matches"
    bad = run_tool(tools["grep"], {"pattern": "("})
    assert bad.exit_code == 1 and "error: bad regular expression" in bad.stderr


# -- 9. bounded memory ---------------------------------------------------------------------

BIG = """
import json, os, resource, sys
from mlx_agent.tools import builtin_tools, parse_tools, run_tool
root = sys.argv[1]
with open(os.path.join(root, "big.txt"), "w") as f:
    f.write("needle " + "x" * (64 << 20) + "\\n")  # one 64 MiB line
tools = {t.name: t for t in builtin_tools(root)}
handler = parse_tools(json.dumps([{"name": "h", "_handler": "tests.test_tool_hardening:big_text",
                                   "parameters": {"type": "object", "properties": {}}}]))[0]
out = {}
for name, tool, args in [("read_file", tools["read_file"], {"path": "big.txt"}),
                         ("grep", tools["grep"], {"pattern": "needle"}),
                         ("handler", handler, {})]:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = run_tool(tool, args)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    out[name] = {"grown_mb": grown, "len": len(r.stdout), "head": r.stdout[:20]}
print(json.dumps(out))
"""


PEAK = """
import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
"""


def big_text():
    return "y" * (64 << 20)


def test_big_files_are_capped_while_reading(tmp_path):
    # a fresh process, so its peak memory says something about these calls alone
    out = subprocess.run([sys.executable, "-c", BIG, str(tmp_path)], capture_output=True,
                         text=True, timeout=120, cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["read_file"]["head"].startswith("needle xxx") and r["read_file"]["len"] < 9000
    assert r["grep"]["head"].startswith("big.txt:1: needle") and r["grep"]["len"] < 9000
    assert r["read_file"]["grown_mb"] < 20 and r["grep"]["grown_mb"] < 20
    # grep's child, measured from a small parent (a forked child counts its parent's pages)
    from mlx_agent.tools import rootfs

    job = json.dumps({"root": str(tmp_path), "pattern": "needle", "path": ".",
                      "max_matches": 5})
    peak = subprocess.run([sys.executable, "-c", PEAK, sys.executable, "-I", rootfs.__file__,
                           job], capture_output=True, text=True, timeout=60)
    assert float(peak.stdout) < 40  # it searched the line's first 64 KiB, not all 64 MiB
    # the handler's own 64 MiB string is its business; no copies of it are ours
    assert r["handler"]["len"] < 9000 and r["handler"]["grown_mb"] < 64 + 20


# -- 10. symlink swaps cannot lead the built-ins outside ----------------------------------

SWAPPER = """
import os, shutil, sys
d, outside = sys.argv[1:]
park = d + ".parked"
while True:  # d: a directory inside the root, then a symlink to outside, and back
    try:
        if os.path.isdir(park):  # put things right after a write made d anew meanwhile
            if os.path.islink(d):
                os.unlink(d)
            shutil.rmtree(d, ignore_errors=True)
            os.rename(park, d)
        os.rename(d, park)
        os.symlink(outside, d)
        for _ in range(20):  # a moment in each state, so that readers meet both
            pass
        os.unlink(d)
        os.rename(park, d)
        for _ in range(20):
            pass
    except OSError:
        pass
"""


@pytest.fixture
def swapping(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "d").mkdir(parents=True), outside.mkdir()
    (root / "d" / "f.txt").write_text("inside\n")
    (outside / "f.txt").write_text("SECRET\n")
    proc = subprocess.Popen([sys.executable, "-c", SWAPPER, str(root / "d"), str(outside)])
    deadline = time.monotonic() + 10
    while not (root / "d").is_symlink():  # until the swapping has begun
        assert proc.poll() is None and time.monotonic() < deadline, "the swapper did not start"
        time.sleep(0.001)
    yield root, outside, proc
    proc.kill()
    proc.wait()


def test_a_symlink_swap_race_never_escapes(swapping):
    # a process, not a thread, swaps: it does not wait for our GIL, so the race is hotter
    root, outside, swapper = swapping
    tools = builtins(root)
    escaped = refused = inside = reads = 0
    deadline = time.monotonic() + 60  # 3,000 reads at least, more while the race is not met
    while reads < 3000 or (min(refused, inside) < 50 and time.monotonic() < deadline):
        r = run_tool(tools["read_file"], {"path": "d/f.txt"})
        reads += 1
        escaped += "SECRET" in r.stdout
        inside += "inside" in r.stdout
        refused += "outside the tool root" in r.stderr
        if reads % 500 == 0:
            time.sleep(0.01)  # a loaded machine may run the swapper only when we wait
    for i in range(2000):
        run_tool(tools["write_file"], {"path": f"d/w{i % 50}.txt", "content": "x"})
    for _ in range(10):  # each grep is a child process: fewer of them
        escaped += "SECRET" in run_tool(tools["grep"], {"pattern": "SECRET", "path": "d"}).stdout
        escaped += "SECRET" in run_tool(tools["grep"], {"pattern": "SECRET"}).stdout
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt"]  # no write landed outside
    assert escaped == 0
    # the race was on: reads met both the directory and the link
    assert refused and inside, (reads, refused, inside, swapper.poll())


def test_symlinks_inside_the_root_still_work(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("hello\n")
    os.symlink("docs", tmp_path / "alias")
    os.symlink("docs/a.md", tmp_path / "a_link.md")
    os.symlink(str(tmp_path / "docs" / "a.md"), tmp_path / "abs_link.md")
    os.mkfifo(tmp_path / "pipe")
    tools = builtins(tmp_path)
    assert run_tool(tools["read_file"], {"path": "alias/a.md"}).stdout == "hello\n"
    assert run_tool(tools["read_file"], {"path": "abs_link.md"}).stdout == "hello\n"
    assert run_tool(tools["read_file"], {"path": "docs/../a_link.md"}).stdout == "hello\n"
    fifo = run_tool(tools["read_file"], {"path": "pipe"})  # refused at once, not a hang
    assert fifo.exit_code == 1 and "not a regular file" in fifo.stderr
    assert run_tool(tools["list_files"], {}).stdout == "a_link.md\nabs_link.md\ndocs/a.md"
    w = run_tool(tools["write_file"], {"path": "a_link.md", "content": "new\n"})
    assert w.exit_code == 0 and (tmp_path / "docs" / "a.md").read_text() == "new\n"
    assert (tmp_path / "a_link.md").is_symlink()


# -- 11. special variable names; write_file's temporary file ------------------------------

@pytest.mark.parametrize("name", ["PATH", "IFS", "PS4", "BASH_ENV", "ENV", "SHELLOPTS",
                                  "LD_PRELOAD", "DYLD_INSERT_LIBRARIES", "BASH_FUNC_x",
                                  "HOME", "CDPATH", "PROMPT_COMMAND", "LC_ALL", "PWD"])
def test_special_variable_names_are_refused_at_load(name):
    with pytest.raises(ToolSchemaError, match=f"tool 't': property {name!r}"):
        exec_tool('echo "$%s"' % name, {name: {"type": "string"}})


def test_a_property_cannot_override_an_allowed_environment_variable(monkeypatch):
    monkeypatch.setenv("GIT_DIR", "/real/.git")
    t = exec_tool('echo "$GIT_DIR"', {"GIT_DIR": {"type": "string"}})
    r = run_tool(t, {"GIT_DIR": "/tmp/evil"}, env_names=["GIT_DIR"])
    assert r.exit_code == -1 and "GIT_DIR" in r.stderr and "--tool-env" in r.stderr


def test_a_failed_write_leaves_no_temporary_file(tmp_path):
    tools = builtins(tmp_path)
    r = run_tool(tools["write_file"], {"path": "x.txt", "content": "a\ud800"})
    assert r.exit_code == 1
    assert os.listdir(tmp_path) == []


FULL_DISK = """
import resource, signal, sys
from mlx_agent.tools import builtin_tools, run_tool
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))  # writes past 1000 bytes fail
tools = {t.name: t for t in builtin_tools(sys.argv[1])}
r = run_tool(tools["write_file"], {"path": "x.txt", "content": "z" * 5000})
print(r.exit_code, r.stderr)
"""


def test_a_write_that_fails_midway_leaves_no_temporary_file(tmp_path):
    (tmp_path / "x.txt").write_text("old\n")
    out = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], capture_output=True,
                         text=True, timeout=60, cwd=Path(__file__).parent.parent)
    assert out.stdout.startswith("1 ") and "File too large" in out.stdout, out
    assert os.listdir(tmp_path) == ["x.txt"] and (tmp_path / "x.txt").read_text() == "old\n"


def test_write_file_keeps_permissions_and_makes_directories(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("old")
    script.chmod(0o755)
    tools = builtins(tmp_path)
    assert run_tool(tools["write_file"], {"path": "run.sh", "content": "new"}).exit_code == 0
    assert script.read_text() == "new" and script.stat().st_mode & 0o777 == 0o755
    assert run_tool(tools["write_file"], {"path": "a/b/c.txt", "content": "x"}).exit_code == 0
    assert (tmp_path / "a" / "b" / "c.txt").read_text() == "x"

