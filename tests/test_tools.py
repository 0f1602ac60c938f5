"""Tool schemas, the executor (real subprocesses) and the built-in tools."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from mlx_agent.tools import (ToolSchemaError, advised_tool, builtin_tools, declared_tools,
                             parse_tools, run_tool)
from mlx_agent.tools.builtin import OutsideRoot
from mlx_agent.tools import rootfs
from mlx_agent.tools.rootfs import located

from .ctrl_c import CTRL_C_AT


def tool(template, props=None, required=None, exec_args=None, name="t"):
    fn = {"name": name, "description": "d",
          "parameters": {"type": "object", "properties": props or {"text": {"type": "string"}},
                         "required": required if required is not None else []},
          "_exec": template}
    if exec_args is not None:
        fn["_exec_args"] = exec_args
    return parse_tools(json.dumps([{"type": "function", "function": fn}]))[0]


# -- schemas ---------------------------------------------------------------------------

def test_both_entry_shapes_and_the_signature_line():
    data = {"tools": [
        {"type": "function", "function": {
            "name": "run_test", "description": "Run a single test",
            "parameters": {"type": "object", "properties": {
                "name": {"type": "string"}, "timeout": {"type": "integer"}, "flag": {}},
                "required": ["name"]},
            "_exec": "echo \"$name\""}},
        {"name": "ping", "description": "top-level fields", "_handler": "os.path:exists",
         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
    ]}
    run, ping = parse_tools(json.dumps(data))
    assert run.signature() == "run_test(name: string, flag?: string, timeout?: integer)"
    assert run.exec_args == ("flag", "name", "timeout")  # default: alphabetical
    assert ping.handler == "os.path:exists" and ping.openai()["function"]["name"] == "ping"


@pytest.mark.parametrize("entry,message", [
    ({"name": "bad name", "_exec": "x"}, "'bad name' is not an identifier"),
    ({"name": "echo\n", "_exec": "x"}, r"'echo\\n' is not an identifier"),  # "$" took the \n
    ({"name": "t"}, "tool 't': has neither '_exec' nor '_handler'"),
    ({"name": "t", "_exec": "x", "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}}},
     "field 'parameters.properties.a.type'"),
    ({"name": "t", "_exec": "x", "parameters": {"type": "object", "required": ["zz"]}},
     "field 'required' names 'zz'"),
    ({"name": "t", "_exec": 5}, "field '_exec'"),
    ({"name": "t", "_handler": "no_such_mod_q:f"}, "field '_handler'"),
    ({"name": "t", "_exec": "x", "_exec_args": ["a;b"]}, "'_exec_args' entry 'a;b'"),
    ({"name": "t", "_exec": "x", "_exec_args": ["a\n"]}, r"'_exec_args' entry 'a\\n'"),
])
def test_schema_errors_name_file_tool_and_field(tmp_path, entry, message):
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([entry]))
    from mlx_agent.tools import load_tools

    with pytest.raises(ToolSchemaError, match=message) as err:
        load_tools(path, handlers="import")  # the user's own file: a handler is imported
    assert str(path) in str(err.value)


def test_a_tools_file_past_the_size_limit_is_refused_before_it_is_read(tmp_path):
    """A 3 GB sparse tools file was read whole (3.1 GB, 11 s) before its JSON was found bad."""
    from mlx_agent.tools import load_tools
    from mlx_agent.tools.schema import MAX_FILE_BYTES

    path = tmp_path / "tools.json"
    with open(path, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(ToolSchemaError, match=f"cannot read tools file {path}: it is "
                                              f"{MAX_FILE_BYTES + 1:,} bytes, over the 16 MiB"):
        load_tools(path)


def test_a_declared_name_with_a_final_newline_is_refused():
    """A client's tool names were checked with match and "$", which matches before a final
    newline: "f\\n" passed."""
    with pytest.raises(ToolSchemaError, match="must be 1-64 letters"):
        declared_tools([{"type": "function", "function": {"name": "f\n"}}])


def test_arguments_are_validated_against_the_schema():
    t = tool("true", props={"n": {"type": "integer"}, "mode": {"enum": ["a", "b"]},
                            "flag": {"type": "boolean"}}, required=["n"])
    t = parse_tools(json.dumps([{"name": "t", "_exec": "true", "parameters": {
        **t.parameters, "additionalProperties": False}}]))[0]
    assert t.validate({"n": 1, "mode": "a", "flag": True}) == []
    assert any("'n' is a required property" in e for e in t.validate({}))
    assert any("mode" in e for e in t.validate({"n": 1, "mode": "c"}))
    assert any("not of type 'boolean'" in e for e in t.validate({"n": 1, "flag": 1}))
    assert any("not of type 'integer'" in e for e in t.validate({"n": "1"}))
    assert any("Additional properties" in e for e in t.validate({"n": 1, "x": 2}))
    assert t.validate([1]) == ["arguments must be a JSON object, got list"]


# -- executor --------------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    "it's", 'say "hi"', "$(touch PWNED)", "`touch PWNED`", "a; touch PWNED", "line1\nline2",
    "ünïcödé 東京 🚀", "$HOME", "\\'; touch PWNED; echo '",
])
def test_argument_values_never_execute(tmp_path, value):
    t = tool('printf "%s" "$text"')
    r = run_tool(t, {"text": value}, cwd=tmp_path)
    assert r.exit_code == 0 and r.stdout == value
    assert not (tmp_path / "PWNED").exists()


def test_non_string_values_become_json():
    t = tool('printf "%s|%s|%s|%s" "$a" "$b" "$c" "$d"',
             props={"a": {"type": "integer"}, "b": {"type": "boolean"}, "c": {"type": "object"},
                    "d": {"type": "array"}}, exec_args=["a", "b", "c", "d"])
    r = run_tool(t, {"a": 1, "b": False, "c": {"k": "v"}, "d": [1, "x"]})
    assert r.stdout == '1|false|{"k": "v"}|[1, "x"]'


def test_environment_is_minimal(monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("ALLOWED_ONE", "ok")
    t = tool('echo "[$SECRET_TOKEN][$ALLOWED_ONE][$PATH]"; read -t 1 x; echo "stdin=$?"')
    r = run_tool(t, {}, env_names=["ALLOWED_ONE"])
    assert "[][ok][" in r.stdout and "hunter2" not in r.stdout
    assert "stdin=1" in r.stdout  # stdin is closed: read hits end-of-file


def test_timeout_kills_the_whole_process_group(tmp_path):
    marker = tmp_path / "alive"
    t = tool(f'(sleep 3; touch {marker}) & sleep 30')
    start = time.monotonic()
    r = run_tool(t, {}, timeout=1.0)
    assert r.timed_out and time.monotonic() - start < 5
    time.sleep(3.5)
    assert not marker.exists()  # the background grandchild died with the group


def test_background_children_do_not_outlive_a_finished_tool(tmp_path):
    marker = tmp_path / "late"
    r = run_tool(tool(f'(sleep 2; touch {marker}) & echo started'), {}, timeout=10)
    assert r.stdout.strip() == "started" and not r.timed_out
    time.sleep(2.5)
    assert not marker.exists()


def test_a_process_that_leaves_the_group_with_the_pipes_open_cannot_hold_the_call(tmp_path):
    """Unsandboxed, a setsid child that kept stdout and stderr open held the call for 5 s a
    pipe after the tool ended (10 s, whatever --tool-timeout said)."""
    pid = tmp_path / "pid"
    t = tool(f"setsid sh -c 'echo $$ > {pid}; exec sleep 60' & "
             f"while [ ! -s {pid} ]; do sleep 0.05; done; echo started")
    start = time.monotonic()
    try:
        r = run_tool(t, {}, timeout=30)
        took = time.monotonic() - start
    finally:
        os.kill(int(pid.read_text()), signal.SIGKILL)
    assert r.stdout.strip() == "started" and not r.timed_out and took < 5, took


INTERRUPTED_AT = CTRL_C_AT + """
from mlx_agent.tools.executor import run_process
pid = sys.argv[2]
ctrl_c_at(int(sys.argv[1]), ("acquire", "sleep"))  # just after a lock taken, a sleep slept
try:
    run_process(["/bin/sh", "-c", f"echo $$ > {pid}; exec sleep 60"], tool="t", timeout=30)
except KeyboardInterrupt:  # the tool killed and reaped first: no process, not even a zombie
    started = open(pid).read().strip() if os.path.exists(pid) else ""
    sys.exit(4 if started and os.path.exists(f"/proc/{started}") else 0)
sys.exit(3)
"""


@pytest.mark.parametrize("at", range(1, 25))
def test_a_ctrl_c_at_any_point_of_the_wait_ends_the_call_with_the_tool_reaped(tmp_path, at):
    """Popen.wait(timeout) polls by taking a lock just before the try that releases it: a
    Ctrl-C (or the CLI's SIGTERM) that landed between the two kept the lock, and the wait that
    reaps the killed tool blocked for ever (the CLI hung once in CI; here from the ninth on).
    A Thread.join interrupted so marks the thread done while it runs: the call raised before
    the tool was reaped."""
    r = subprocess.run([sys.executable, "-c", INTERRUPTED_AT, str(at), str(tmp_path / "pid")],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr


HUGE = """
import json, resource
from mlx_agent.tools import parse_tools, run_tool
t = parse_tools(json.dumps([{"name": "t", "_exec": "head -c 50000000 /dev/zero | tr '\\\\0' x; echo END"}]))[0]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
r = run_tool(t, {}, timeout=60)
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps({"grown_mb": grown, "exit": r.exit_code, "stdout": r.stdout}))
"""


def test_huge_output_is_capped_with_bounded_memory():
    # a fresh process, so its peak memory says something about this run alone
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", HUGE], capture_output=True, text=True,
                         timeout=120, check=True)
    r = json.loads(out.stdout)
    assert r["exit"] == 0
    assert len(r["stdout"]) < 9000 and "…[truncated 49991" in r["stdout"]
    assert r["stdout"].endswith("END\n")
    assert r["grown_mb"] < 30  # 50 MB went through; holding it would grow RSS past that


def test_binary_output_survives():
    r = run_tool(tool("printf '\\xff\\xfeok\\x00'"), {})
    assert r.exit_code == 0 and "ok" in r.stdout and "\ufffd" in r.stdout
    json.loads(r.for_model())


def test_exit_code_and_stderr_come_back():
    r = run_tool(tool("echo oops >&2; exit 3"), {})
    assert (r.exit_code, r.stderr, r.timed_out) == (3, "oops\n", False)


def test_python_handler(tmp_path):
    t = parse_tools(json.dumps([{"name": "join", "_handler": "os.path:join",
                                 "parameters": {"type": "object", "properties": {
                                     "a": {"type": "string"}}}}]))[0]
    assert run_tool(t, {"a": "x"}).stdout == "x"
    bad = run_tool(t, {"nope": 1})
    assert bad.exit_code == 1 and "TypeError" in bad.stderr


# -- built-in tools --------------------------------------------------------------------

@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "test_calc.py").write_text(
        "import unittest\nfrom pkg.calc import add\n\n"
        "class T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\n")
    (tmp_path / "secret.txt").write_text("top secret")
    os.symlink(tmp_path / "secret.txt", root / "link.txt")
    return root


def test_builtin_tools_work_inside_the_root(repo):
    tools = {t.name: t for t in builtin_tools(repo, timeout=60)}
    assert run_tool(tools["read_file"], {"path": "pkg/calc.py"}).stdout.startswith("def add")
    assert "pkg/calc.py" in run_tool(tools["list_files"], {}).stdout
    assert "pkg/calc.py:2:     return a - b" in run_tool(tools["grep"], {"pattern": r"a - b"}).stdout
    w = run_tool(tools["write_file"], {"path": "pkg/calc.py",
                                       "content": "def add(a, b):\n    return a + b\n"})
    assert w.exit_code == 0
    r = run_tool(tools["run_tests"], {})
    assert r.exit_code == 0, r.stdout + r.stderr


def test_grep_in_lower_case_matches_any_case(tmp_path):
    """As ripgrep's --smart-case: "Where is flour mentioned?" grepped "flour", and the file's
    "Flour, from the miller" was "no matches"."""
    (tmp_path / "supplies.md").write_text("Flour, from the miller\nflour again\nSUGAR\n")
    tools = {t.name: t for t in builtin_tools(tmp_path, timeout=60)}
    for pattern, lines in [("flour", [1, 2]), ("Flour", [1]), (r"\wlour", [1, 2]),
                           (r"\S+", [1, 2, 3]), ("[A-Z]{5}", [3]), ("sugar", [3])]:
        out = run_tool(tools["grep"], {"pattern": pattern}).stdout
        assert [int(line.split(":")[1]) for line in out.splitlines()] == lines, pattern


def test_a_missing_path_is_answered_with_the_paths_it_may_mean(repo):
    tools = {t.name: t for t in builtin_tools(repo, timeout=60)}
    for tool, arguments in [("read_file", {"path": "calc.py"}), ("read_file", {"path": "CALC"}),
                            ("list_files", {"path": "calc.py"}),
                            ("grep", {"pattern": "add", "path": "calc.py"})]:
        r = run_tool(tools[tool], arguments)
        assert r.exit_code == 1 and r.stderr.rstrip().endswith(
            "; did you mean 'pkg/calc.py'?"), (tool, r.stderr)
    # nothing it may mean: what to do instead
    for tool, arguments, advice in [
            ("read_file", {"path": "nothing.py"}, "call the list_files tool"),
            ("read_file", {"path": "this_folder"}, "call the list_files tool"),
            ("read_file", {"path": "TODO"}, "to find the files that mention 'TODO', call the grep tool"),
            ("list_files", {"path": "here"}, "leave the path out to list every file"),
            ("grep", {"pattern": "a", "path": "x"}, "leave the path out to search every file")]:
        r = run_tool(tools[tool], arguments)
        assert r.exit_code == 1 and "did you mean" not in r.stderr and advice in r.stderr
    (repo / "deep").mkdir()
    for i in range(20):  # of the first names walked only: a big tree costs a bounded scan
        (repo / "deep" / f"{i}.txt").write_text("")
    assert rootfs.near(str(repo), "7") == ["deep/7.txt"]
    assert rootfs.near(str(repo), "7", scanned=5) == [] and rootfs.near(str(repo), "..") == []
    # the tool each error advises: another built-in one, or the same again
    advised = {(tool, json.dumps(arguments)): advised_tool(tools[tool], run_tool(tools[tool],
                                                                                arguments))
               for tool, arguments in [("read_file", {"path": "TODO"}),
                                       ("read_file", {"path": "this_folder"}),
                                       ("read_file", {"path": "calc.py"}),
                                       ("grep", {"pattern": "a", "path": "x"}),
                                       ("read_file", {"path": "pkg/calc.py"})]}
    assert list(advised.values()) == ["grep", "list_files", "read_file", "grep", None]
    # only the runtime's own words ending the error count: not a path echoed in it, nor a
    # tool that writes
    echoed = run_tool(tools["read_file"], {"path": "x; leave the path out to list every file"})
    assert advised_tool(tools["read_file"], echoed) == "list_files"
    write = run_tool(tools["write_file"], {"path": "../a; did you mean 'b'?", "content": "x"})
    assert write.exit_code and advised_tool(tools["write_file"], write) is None
    # a tool that is not built in advises nothing, whatever its error says
    mimic = parse_tools(json.dumps([{"name": "m", "parameters": {"type": "object"},
                                     "_exec": "echo \"x; did you mean 'y'?\" >&2; exit 1"}]))[0]
    assert advised_tool(mimic, run_tool(mimic, {})) is None
    # a link (here one that leads out of the root) is never suggested, nor the path asked
    assert rootfs.near(str(repo), "link.txt") == [] and rootfs.near(str(repo), "secret") == []
    assert rootfs.near(str(repo), "pkg/calc.py") == []


@pytest.mark.parametrize("path", ["../secret.txt", "../../etc/passwd", "/etc/passwd", "link.txt"])
def test_paths_outside_the_root_are_refused(repo, path):
    tools = {t.name: t for t in builtin_tools(repo)}
    r = run_tool(tools["read_file"], {"path": path})
    assert r.exit_code == 1 and "outside the tool root" in r.stderr
    w = run_tool(tools["write_file"], {"path": path, "content": "x"})
    assert w.exit_code == 1 and "outside the tool root" in w.stderr
    with pytest.raises(OutsideRoot), located(str(repo), path):
        pass
    assert "secret" not in run_tool(tools["grep"], {"pattern": "secret"}).stdout


def test_tool_choice_words_are_not_tool_names():
    with pytest.raises(ToolSchemaError, match="'none' is reserved"):
        declared_tools([{"name": "none", "parameters": {"type": "object"}}])


def test_boolean_property_schemas_are_schemas(tmp_path):
    # JSON Schema allows true (anything) and false (nothing) for a property: the prompt's
    # signature used to call .get on them
    (tool,) = parse_tools(json.dumps([{"name": "t", "description": "d", "_exec": "true",
        "parameters": {"type": "object", "properties": {"x": False, "y": True}}}]))
    assert tool.signature() == "t(x?: any, y?: any)"


def test_the_signature_reads_types_through_refs_and_unions():
    # Pydantic's shapes: a nested model by $ref, Optional[int] as anyOf with null
    (tool,) = declared_tools([{"name": "book", "parameters": {
        "type": "object", "$defs": {"City": {"type": "object", "properties": {}}},
        "properties": {"origin": {"$ref": "#/$defs/City"},
                       "nights": {"anyOf": [{"type": "integer"}, {"type": "null"}]}},
        "required": ["origin"]}}])
    assert tool.signature() == "book(origin: object, nights?: integer|null)"


@pytest.mark.parametrize("props, message", [
    # valid JSON Schema that no grammar can be made of: refused as the file loads, not
    # after the model did (where the error named no file)
    ({"loop": {"$ref": "#/$defs/Loop"}}, "'parameters.properties.loop.$ref' starts a chain "
     "of references that loops without a schema (#/$defs/Loop -> #/$defs/Loop)"),
    ({"gone": {"$ref": "#/$defs/Gone"}}, "'#/$defs/Gone', which points at nothing"),
    ({"far": {"$ref": "https://example.com/s.json"}}, "not a reference inside the schema"),
    ({"n": {"type": "string", "maxLength": 5.0}}, "'parameters.properties.n.maxLength' is "
     "5.0; give a whole number"),
    ({"n": {"type": "array", "minItems": 1e30}}, "is 1e+30; give a whole number"),
])
def test_a_schema_no_grammar_can_be_made_of_is_refused_at_load(props, message):
    with pytest.raises(ToolSchemaError, match=re.escape(message)):
        declared_tools([{"name": "t", "parameters": {
            "type": "object", "$defs": {"Loop": {"$ref": "#/$defs/Loop"}}, "properties": props}}])


def test_a_tools_file_that_is_no_regular_file_or_nests_too_deeply_is_one_error(tmp_path):
    from mlx_agent.tools import load_tools

    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(ToolSchemaError, match="not a regular file"):
        load_tools(tmp_path / "fifo.json")  # at once: reading it would wait for a writer
    schema = '{"type":"object"}'
    for _ in range(3000):
        schema = '{"type":"object","properties":{"x":' + schema + '}}'
    (tmp_path / "deep.json").write_text(
        '[{"name":"t","description":"d","_exec":"true","parameters":' + schema + '}]')
    with pytest.raises(ToolSchemaError, match="nested too deeply"):
        load_tools(tmp_path / "deep.json")


def test_write_file_never_writes_inside_a_git_directory(tmp_path):
    (tmp_path / ".git").mkdir()
    tools = {t.name: t for t in builtin_tools(tmp_path)}
    (tmp_path / "g").symlink_to(".git")  # planted by another tool: the walk still sees .git
    for path in (".git/config", "a/../.git/hooks/pre-commit", ".GIT/x", "sub/.git/config",
                 "g/config", ".git"):
        r = run_tool(tools["write_file"], {"path": path, "content": "x"})
        assert r.exit_code != 0 and "inside a .git directory" in r.stderr.lower(), \
            (path, r)
    assert not any((tmp_path / ".git").iterdir())
    r = run_tool(tools["write_file"], {"path": "sub/.gitignore", "content": "x"})
    assert r.exit_code == 0


def test_write_file_never_completes_a_bare_repositorys_layout(tmp_path):
    # git takes HEAD beside objects/ and refs/ for a repository, and runs its config
    tools = {t.name: t for t in builtin_tools(tmp_path)}
    write = lambda path: run_tool(tools["write_file"], {"path": path, "content": "x"})  # noqa
    for first, second, third in (("pkg/objects/a", "pkg/refs/b", "pkg/HEAD"),
                                 ("q/HEAD", "q/objects/a", "q/refs/b")):
        assert write(first).exit_code == 0 and write(second).exit_code == 0
        r = write(third)
        assert r.exit_code != 0 and "would make a directory a git repository" in r.stderr, r
    assert write("r/HEAD/x").exit_code == 0  # HEAD alone makes no repository
    os.makedirs(tmp_path / "s" / "objects")
    os.symlink("refs/heads/main", tmp_path / "s" / "HEAD")  # git takes a HEAD symlink too
    r = write("s/refs/heads/main")
    assert r.exit_code != 0 and "would make a directory a git repository" in r.stderr, r


def test_write_file_never_completes_a_worktrees_layout_nor_writes_a_git_directory(tmp_path):
    """A hostile tester's breaches: HEAD beside a commondir file is a git directory too (its
    config lives in the common one), and a git directory need not be named .git (a bare
    repository, the one a .git file points to): git runs the config it finds in either."""
    import subprocess

    tools = {t.name: t for t in builtin_tools(tmp_path)}
    write = lambda path: run_tool(tools["write_file"], {"path": path, "content": "x"})  # noqa
    assert write("w/HEAD").exit_code == 0
    r = write("w/commondir")
    assert r.exit_code != 0 and "would make a directory a git repository" in r.stderr, r
    subprocess.run(["git", "init", "-q", "--separate-git-dir", str(tmp_path / "store"),
                    str(tmp_path / "work")], check=True)
    subprocess.run(["git", "init", "-q", "--bare", str(tmp_path / "remote.git")], check=True)
    for path in ("store/config", "store/hooks/pre-commit", "remote.git/config",
                 "remote.git/new/x"):
        r = write(path)
        assert r.exit_code != 0 and "is a git directory" in r.stderr, (path, r)
    assert "x" not in (tmp_path / "store" / "config").read_text()
    assert write("work/notes.txt").exit_code == 0  # the work tree is the user's files


def test_list_files_and_grep_walk_a_tree_deeper_than_the_recursion_limit(tmp_path):
    # os.fwalk recursed a level at a time: one tool's mkdir -p of 1,100 folders made
    # every later list_files and grep over the root a RecursionError
    fd = os.open(tmp_path, os.O_RDONLY)
    for _ in range(1100):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    with open(os.open("note.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd), "w") as f:
        f.write("hello Dana\n")
    os.close(fd)
    try:
        tools = {t.name: t for t in builtin_tools(tmp_path)}
        r = run_tool(tools["grep"], {"pattern": "Dana"})
        assert r.exit_code == 0 and r.stdout.endswith("/d/note.txt:1: hello Dana"), r.stderr
        r = run_tool(tools["list_files"], {})
        assert r.exit_code == 0 and "note.txt" in r.stdout, r.stderr[-300:]
    finally:  # pytest's own clean-up (shutil.rmtree) recurses, and would fail later on it
        subprocess.run(["rm", "-rf", str(tmp_path / "d")], timeout=60)


def test_grep_names_a_huge_file_and_searches_the_files_after_it(tmp_path):
    # one 5 GB file used to take grep's whole timeout and hide every file after it
    with open(tmp_path / "a_big", "wb") as f:
        f.truncate(5 << 30)  # sparse: no disk used
    (tmp_path / "b.txt").write_text("hello Dana\n")
    tools = {t.name: t for t in builtin_tools(tmp_path)}
    r = run_tool(tools["grep"], {"pattern": "Dana"})
    assert r.exit_code == 0 and not r.timed_out
    assert r.stdout.splitlines() == ["b.txt:1: hello Dana", "(not searched, over 256 MB: a_big)"]


def test_exec_args_must_name_properties_and_a_bom_is_no_error(tmp_path):
    entry = {"name": "say", "_exec": 'echo "$1"', "_exec_args": ["txt"],
             "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}
    with pytest.raises(ToolSchemaError, match="'_exec_args' names 'txt', which is not a "
                                              r"property \(properties: text\)"):
        parse_tools(json.dumps([entry]))
    entry["_exec_args"] = ["text"]
    (tool,) = parse_tools(b"\xef\xbb\xbf" + json.dumps([entry]).encode())  # Notepad's BOM
    assert tool.exec_args == ("text",)


def test_a_server_reads_plain_openai_schemas_from_a_tools_file(tmp_path):
    from mlx_agent.tools import load_tools

    path = tmp_path / "tools.json"
    path.write_text(json.dumps([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather.", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}}]))
    with pytest.raises(ToolSchemaError, match="neither '_exec' nor '_handler'"):
        load_tools(path)  # the agent runs its tools: it needs a way to
    assert [t.name for t in load_tools(path, runnable=False)] == ["get_weather"]


def test_an_argument_past_linuxs_128_kib_reaches_the_tool_and_stdin_stays_empty():
    # one argument of execve holds at most 128 KiB: "Argument list too long" before
    (tool,) = parse_tools(json.dumps([{"name": "size", "_exec": 'printf %s "$text" | wc -c; cat',
                                       "parameters": {"type": "object", "properties": {
                                           "text": {"type": "string"}}}}]))
    for n in (10, 300_000):
        r = run_tool(tool, {"text": "é" * n})
        assert r.exit_code == 0 and r.stdout.split() == [str(2 * n)], r


def test_a_pattern_that_backtracks_for_ever_is_checked_with_a_time_limit():
    """A tools file's pattern against a value a model wrote (without the grammar) or a
    forced call's: re cannot be interrupted, and this one takes 2^40 steps."""
    (tool,) = parse_tools(json.dumps([{
        "name": "t", "description": "d", "_exec": "true", "parameters": {
            "type": "object", "properties": {"x": {"type": "string", "pattern": "^(a|a)*$"}}}}]))
    start = time.monotonic()
    (problem,) = tool.validate({"x": "a" * 40 + "b"})
    assert "took more than 0.5 s to check" in problem and time.monotonic() - start < 5
    assert tool.validate({"x": "aaa"}) == [] and "does not match" in tool.validate({"x": "b"})[0]


def test_a_pattern_in_json_schemas_dialect_that_re_lacks_is_accepted():
    r"""``\p{L}`` is in ECMA-262's regex dialect (JSON Schema's) and llguidance's; ``re``
    refused it, so a valid tool was refused."""
    (tool,) = parse_tools(json.dumps([{
        "name": "greet", "description": "d", "_exec": "true", "parameters": {
            "type": "object", "properties": {"x": {"type": "string", "pattern": r"^\p{L}+$"}}}}]))
    assert tool.validate({"x": "Zoë"}) == [] and "does not match" in tool.validate({"x": "42"})[0]
    with pytest.raises(ToolSchemaError, match="is not a 'regex'"):
        parse_tools(json.dumps([{"name": "t", "description": "d", "_exec": "true", "parameters": {
            "type": "object", "properties": {"x": {"type": "string", "pattern": "[a-"}}}}]))


def test_an_endless_schema_with_an_id_at_its_root_is_still_refused():
    """Only a nested $id (a new base for its refs) makes the endless check stand aside; a
    root one, as most published schemas carry, made it stand aside too."""
    params = {"$id": "https://example.com/s", "type": "object",
              "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
    with pytest.raises(ToolSchemaError, match="admits no value the grammar can finish"):
        declared_tools([{"type": "function", "function": {"name": "f", "parameters": params}}])


def test_expected_arguments_no_valid_call_can_hold_are_named():
    # an eval task's expected arguments: some of a call's, each judged where it stands
    city = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    book = parse_tools(json.dumps([{"name": "book", "_exec": "true", "parameters": {
        "type": "object", "$defs": {"City": city},
        "properties": {"to": {"$ref": "#/$defs/City"}, "n": {"type": "integer"}},
        "required": ["to", "n"]}}]))[0]
    assert book.unreachable({"n": 2}) == []  # "to" is left out: the rest is not judged
    assert book.unreachable({"to": {"name": "Oslo"}}) == []  # through its $ref
    assert book.unreachable({"to": {"name": 5}, "n": "2"}) == [
        "n: '2' is not of type 'integer'", "to.name: 5 is not of type 'string'"]
    assert book.unreachable({"m": 2}) == ["m: not one of the tool's parameters (to, n)"]
    # a schema that admits other names ({} admits any value): an extra one can be written
    free = parse_tools(json.dumps([{"name": "free", "_exec": "true", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}},
        "additionalProperties": {}}}]))[0]
    assert free.unreachable({"m": [1]}) == []


def test_a_property_that_is_no_shell_name_is_refused_for_exec_only_and_named_as_such():
    """The default _exec_args (every property) is checked for shell names: a _handler
    tool, which gets keyword arguments, was refused for a "user-id", and an _exec tool's
    error named an '_exec_args' entry the file did not have."""
    props = {"user-id": {"type": "string"}}
    entry = {"name": "h", "_handler": "builtins:dict",
             "parameters": {"type": "object", "properties": props, "required": ["user-id"]}}
    (handler,) = parse_tools(json.dumps([entry]))
    r = run_tool(handler, {"user-id": "u1"})
    assert r.exit_code == 0 and "u1" in r.stdout, r
    with pytest.raises(ToolSchemaError, match="tool 'e': property 'user-id' is not a shell "
                                              "variable's name, and _exec gets every property "
                                              "as one; rename it, or list in '_exec_args'"):
        tool("echo hi", props=props, name="e")
    assert tool("echo hi", props={**props, "id": {"type": "string"}}, exec_args=["id"],
                name="e").exec_args == ("id",)


def test_a_json_file_that_does_not_parse_says_where(tmp_path):
    # "JSON is malformed: invalid character (byte 106)": a byte offset, in a file a person
    # edits by line and column
    from mlx_agent.evaluate import TaskError, load_tasks
    from mlx_agent.tools.mcp import McpError, load_config

    entry = '[{"name": "t", "description": "d",\n  "parameters": {"type": "object", ' \
            '"properties": {"n": {"type": "number", "default": NaN}}}}]'
    with pytest.raises(ToolSchemaError, match=re.escape(
            "tools.json: not valid JSON (invalid character 'N' at line 2, column 86 (JSON has "
            "no NaN; write null or a number))")):
        parse_tools(entry.encode(), "tools.json")
    with pytest.raises(ToolSchemaError, match=re.escape(
            "t.json: not valid JSON (trailing comma in array at column 4)")):
        parse_tools(b"[1,]", "t.json")
    with pytest.raises(ToolSchemaError, match=re.escape(
            "(the JSON ends early (an unclosed bracket, brace or string))")):
        parse_tools(b'{"tools": [', "t.json")
    with pytest.raises(ToolSchemaError, match=re.escape(  # where the second document opens
            "t.json: not valid JSON (trailing characters at line 2, column 1)")):
        parse_tools(b'[]\n{"name": "t"}', "t.json")
    config = tmp_path / "mcp.json"
    config.write_text('{"mcpServers": {"x": {"command": \'srv\'}}}')
    with pytest.raises(McpError, match=re.escape("mcp.json: not valid JSON (invalid character "
                                                 "\"'\" at column 34 (JSON strings take "
                                                 "double quotes))")):
        load_config(config)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": hi}\n')
    with pytest.raises(TaskError, match=re.escape("tasks.jsonl:1: not a task (invalid "
                                                  "character 'h' at column 12)")):
        load_tasks(tasks)


@pytest.mark.parametrize("pattern", ["^(){99999}$", "^((){999}){999}$",
                                     "^((?:){99999}){99999}$"])
def test_a_pattern_regex_cannot_compile_in_time_is_refused_at_once(pattern):
    # regex compiles repeated empty groups in time that grows with the square of the count
    # (nested: the product), uninterruptibly: a tools file (or a request's tools) held the
    # process for minutes
    import time

    entry = [{"name": "t", "description": "d", "_exec": "echo", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}}}]
    start = time.perf_counter()
    with pytest.raises(ToolSchemaError, match=re.escape(f"'{pattern}' is not a 'regex'")):
        parse_tools(json.dumps(entry).encode(), "t.json")
    assert time.perf_counter() - start < 5  # 0.001 s; minutes before
    for fine in ("^(){999}$", "^[A-Za-z0-9+/]{0,10000}={0,2}$", r"^(\d{1,3}\.){3}\d{1,3}$",
                 "^(a){9999}$"):
        entry[0]["parameters"]["properties"]["a"]["pattern"] = fine
        assert parse_tools(json.dumps(entry).encode(), "t.json")[0].name == "t"
