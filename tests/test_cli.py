"""The command line as a user runs it: real subprocesses, exit codes, one-line errors."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest

from mlx_agent.models import tinygpt_format as fmt

from .conftest import pid_alive, random_tinygpt_file, wait_for_line
from .test_agent_cli import default_sigint

CLI = [sys.executable, "-m", "mlx_agent.cli.main"]


def run(*args, stdin=None, env=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, input=stdin,
                          timeout=300, env={**os.environ, **(env or {})})


def test_generate_chat_with_the_bundled_model():
    r = run("generate", "--chat", "--max-tokens", "24", "-v", "What is the capital of France?")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert "prefilled" in r.stderr and "tok/s" in r.stderr


def test_models_lists_the_default_and_its_file():
    r = run("models")
    assert r.returncode == 0, r.stderr
    assert "* smollm2-135m" in r.stdout and ".gguf" in r.stdout
    assert "BLAS:" in r.stdout
    assert "adapter: a tool-calling adapter, loaded by the commands that call tools" in r.stdout


def test_generate_on_a_tinygpt_from_stdin(tmp_path):
    path = tmp_path / "m.tinygpt"
    fmt.write(path, random_tinygpt_file())
    r = run("generate", "-m", str(path), "--max-tokens", "5", "--no-kv-preallocate", "-",
            stdin="abc")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args,message", [
    (["generate", "-m", "/no/such/model", "hi"], "no model at '/no/such/model'"),
    (["generate", "--context-length", "0", "hi"], "context length must be a positive"),
    (["generate", "--max-tokens", "0", "hi"], "--max-tokens"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = run(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("content", [b"", b"GGUF\x03\x00garbage", b"TGPT\x02\x00\x00\x00\xff\xff\xff\x00"])
def test_corrupt_model_files_exit_2_without_traceback(tmp_path, content):
    path = tmp_path / "broken.bin"
    path.write_bytes(content)
    r = run("generate", "-m", str(path), "hi")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("mlx_agent: error:") and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_prompt_longer_than_the_context_is_a_clear_error():
    r = run("generate", "--context-length", "8", "one two three four five six seven eight nine ten")
    assert r.returncode == 2
    assert "exceed the 8-token context" in r.stderr


def test_the_package_list_names_every_package_in_the_tree():
    """pyproject lists packages by hand (cli/ and kernels/ install inside mlx_agent): an
    editable install finds a missing one anyway, a wheel leaves it out."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    where = {v: k for k, v in config["package-dir"].items()}
    found = set()
    for init in [*root.glob("mlx_agent/**/__init__.py"), root / "cli" / "__init__.py",
                 root / "kernels" / "__init__.py"]:
        rel = init.parent.relative_to(root).as_posix()
        top = rel.split("/")[0]
        found.add(".".join([where.get(top, top), *rel.split("/")[1:]]))
    assert found == set(config["packages"])


@pytest.fixture
def adapter_of(monkeypatch, tmp_path):
    """``adapter_of(options)(*args)``: (exit code, the adapter a command decorated with
    ``options`` gets for ``args``), with a shipped adapter for ``smollm2-135m`` in
    ``tmp_path``."""
    import click
    from click.testing import CliRunner

    from mlx_agent.models import registry as models

    shipped = tmp_path / "smollm2-135m-general"
    shipped.mkdir()
    (shipped / "adapter_config.json").write_text("{}")
    monkeypatch.setattr(models, "ADAPTERS_DIR", tmp_path)

    def with_options(*decorators):
        def show(model_spec, adapter, weights, context_length):
            click.echo(f"adapter={adapter}")

        for decorate in reversed(decorators):  # as if stacked over the function
            show = decorate(show)
        show = click.command()(show)

        def out(*args):
            r = CliRunner().invoke(show, list(args), env={"MLX_AGENT_MODEL": ""})
            return r.exit_code, r.output.strip()
        return out

    return with_options


def test_a_models_shipped_adapter_is_the_default_unless_told_otherwise(adapter_of, tmp_path):
    """load_options fills --adapter with the model's shipped adapter; --adapter DIR and
    --no-adapter win, both at once is a usage error, and a -base name has none."""
    from mlx_agent.cli import options
    from mlx_agent.models import registry as models

    shipped = tmp_path / "smollm2-135m-general"
    out = adapter_of(options.model_argument(), options.load_options)
    assert models.default_adapter("smollm2-135m") == shipped
    assert models.default_adapter("smollm2-135m-base") is None
    assert models.default_adapter(str(tmp_path / "other.gguf")) is None
    assert out() == (0, f"adapter={shipped}")
    assert out("smollm2-135m-base") == (0, "adapter=None")
    assert out("--no-adapter") == (0, "adapter=None")
    assert out("--adapter", str(tmp_path)) == (0, f"adapter={tmp_path}")
    code, text = out("--adapter", str(tmp_path), "--no-adapter")
    assert code == 2 and "give --adapter DIR or --no-adapter, not both" in text


def test_generate_loads_no_shipped_adapter(adapter_of, tmp_path):
    """model_options (generate: plain text, no tools) leaves the tool-calling adapter a
    named model ships with unloaded; --adapter DIR still loads one."""
    from mlx_agent.cli import options

    out = adapter_of(options.model_options)
    assert out() == (0, "adapter=None")
    assert out("--no-adapter") == (0, "adapter=None")
    assert out("--adapter", str(tmp_path)) == (0, f"adapter={tmp_path}")
    code, text = out("--adapter", str(tmp_path), "--no-adapter")
    assert code == 2 and "not both" in text


# Prints, at exit, which of the heavy packages the command imported.
_IMPORT_PROBE = """
import atexit, sys
atexit.register(lambda: print("loaded:", *[m for m in ("mlx.core", "mlx_lm", "transformers")
                                           if m in sys.modules], file=sys.stderr))
sys.argv = ["mlx_agent", *sys.argv[1:]]
from mlx_agent.cli.main import main
main()
"""


@pytest.mark.parametrize("args", [["--help"], ["agent", "--help"], ["serve", "--help"],
                                  ["eval-bfcl", "--help"], ["agent", "--max-steps", "0"],
                                  ["generate", "--weights", "int3", "hi"]])
def test_help_and_usage_errors_load_no_model_code(args):
    """--help and usage errors answer before MLX, mlx-lm or transformers load (mlx-lm with
    transformers alone takes about 2.5 s to import): the shared options read their defaults
    from light modules."""
    r = subprocess.run([sys.executable, "-c", _IMPORT_PROBE, *args], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == (0 if "--help" in args else 2), r.stderr
    assert r.stderr.splitlines()[-1] == "loaded:", r.stderr


@pytest.mark.parametrize("package", ["mlx_agent.agent", "mlx_agent.formats", "mlx_agent.models"])
def test_every_name_a_lazy_package_exports_resolves(package):
    """The packages that import their parts on first use (mlx_agent._lazy) still hand over
    every name of their __all__, and say which attribute is missing otherwise."""
    import importlib

    module = importlib.import_module(package)
    assert set(module.__all__) <= set(dir(module))
    for name in dir(module):  # the lazy names among them: each from its submodule
        getattr(module, name)
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'nope'"):
        module.nope  # noqa: B018


@pytest.mark.parametrize("args,message", [
    (["--bogus"], "No such option '--bogus'. (see mlx_agent --help)"),
    (["nosuch"], "No such command 'nosuch'."),
    (["generate"], "Missing argument 'PROMPT'. (see mlx_agent generate --help)"),
    (["generate", "-t", "nan", "hi"], "'nan' is not a finite number"),
    (["eval", "--out", "x.jsonl"], "Missing option '--tasks'."),
])
def test_usage_errors_are_one_line(args, message):
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("mlx_agent: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert message in r.stderr


def test_a_group_with_no_arguments_still_shows_its_help():
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "cache"],
                       capture_output=True, text=True, timeout=60)
    assert "Usage: mlx_agent cache" in r.stdout + r.stderr and "Commands:" in r.stdout + r.stderr


def test_text_from_files_and_models_reaches_the_terminal_escaped(tmp_path):
    import json

    from mlx_agent.cli.terminal import for_terminal

    assert for_terminal("a\x1b]0;title\x07b\r\u202ec\td\ne") == \
        "a\\x1b]0;title\\x07b\\x0d\\u202ec\td\ne"
    t = {"version": 1, "id": "t\x1b]0;pwned\x07", "summary": {}, "steps": [
        {"role": "user", "content": "hi \x1b[2J there", "input_ids": [5]}]}
    (tmp_path / "t.atraj").write_text(json.dumps(t))
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "traj", "show",
                        str(tmp_path / "t.atraj")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "hi \\x1b[2J there" in r.stdout


def test_a_schema_that_admits_nothing_is_an_error_not_an_empty_answer(tmp_path):
    schema = tmp_path / "loop.json"  # a $ref that only refers to itself
    schema.write_text('{"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}')
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "generate",
                        "--json-schema", str(schema), "hi"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"mlx_agent: error: {schema}: '$ref' starts a chain of "
                               "references that loops without a schema")
    assert r.stderr.count("\n") == 1


ECHO = os.path.join(os.path.dirname(__file__), "..", "examples", "echo.json")
TASK = ('{"prompt": "Say hi.", "tools": "tools.json", '
        '"check": {"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]}}\n')


@pytest.mark.parametrize("args,message", [
    # output paths are checked before the model loads, not after minutes of work
    (["agent", "--tools", ECHO, "--single", "hi", "--transcript", "/proc/x/t.jsonl"],
     "--transcript /proc/x/t.jsonl: No such file or directory"),
    (["agent", "--tools", ECHO, "--single", "hi", "--transcript", "/dev/null"],
     "not a regular file"),
    (["agent", "--tools", ECHO, "--single", "hi", "--save-session", "/no/such/dir/s"],
     "the directory /no/such/dir does not exist"),
    (["agent", "--tools", ECHO, "--single", "hi", "--trajectory-dir", "/proc/x"],
     "--trajectory-dir /proc/x: cannot create the directory"),
    (["eval", "--tasks", "{tasks}", "--out", "/proc/x/o.jsonl"], "--out /proc/x/o.jsonl"),
    (["eval", "--tasks", "{tasks}", "--out", "{tmp}"], "is a directory"),
    (["eval", "--tasks", "{tasks}", "--trajectory-dir", "/proc/x"], "--trajectory-dir"),
    (["eval-bfcl", "--out", "/proc/x/b.jsonl"], "--out /proc/x/b.jsonl"),
    # written by a rename over them: /dev/null (as root) became a regular file
    (["eval", "--tasks", "{tasks}", "--out", "/dev/null"], "/dev/null is not a regular file"),
    (["agent", "--tools", ECHO, "--single", "hi", "--save-session", "/dev/null"],
     "--save-session /dev/null is not a regular file"),
    (["agent", "--tools", ECHO, "--single", "hi", "--save-session", ""],
     "--save-session is empty"),
    (["eval", "--tasks", "{tasks}", "--out", "{tasks}"], "is the file --tasks names"),
    (["eval-bfcl", "--out", "{tmp}/b.jsonl", "--runs", "{tmp}/./b.jsonl"],
     "is the file --out names"),
    (["eval", "--tasks", "{tasks}", "--out", "{tmp}/" + "x" * 300], "File name too long"),
    (["eval", "--tasks", "{tasks}", "--trajectory-dir", "{tmp}/" + "x" * 300],
     "File name too long"),
    (["generate", "-m", "{tmp}/" + "x" * 300, "hi"], "no model at"),
    (["generate", "--adapter", "/no/such", "hi"], "adapter /no/such does not exist"),
    # a run that fails after its checks leaves no empty folder they made
    (["agent", "/no/model", "--tools", ECHO, "--single", "hi", "--trajectory-dir",
      "{tmp}/runs/a"], "no model at '/no/model'"),
    (["eval", "/no/model", "--tasks", "{tasks}", "--trajectory-dir", "{tmp}/runs",
      "--out", "{tmp}/runs/o.jsonl"], "no model at '/no/model'"),
    (["sft", "--data", "{tasks}", "--out", "/proc/x"], "--out /proc/x: cannot create"),
    (["traces-to-data", "{tmp}", "--out", "{tmp}/sft.jsonl"], "holds no .atraj files"),
    (["traces-to-data", "{tmp}", "--out", "{tmp}/x.atraj"], "would replace one of the traj"),
    # numbers that are not numbers
    (["agent", "--tools", ECHO, "--single", "hi", "--tool-timeout", "nan"],
     "'nan' is not a finite number"),
    (["traces-to-data", "{tmp}", "--dry-run", "--min-reward", "nan"], "not a finite number"),
    (["synth", "--tools", ECHO, "--out", "{tmp}/s", "--no-tool-share", "nan"],
     "not a finite number"),
    # text that is not text
    (["agent", "--tools", ECHO, "--single", ""], "--single is empty"),
    (["agent", "--tools", ECHO, "--single", b"hi \xff there"],
     "Invalid value for '--single': not valid UTF-8 (byte 0xff at character 3)"),
    (["agent", "--tools", ECHO, "--single", "hi", "--kv-window", "10"],
     "system prompt is 84 tokens, more than the 10-token KV window"),
    # options that do nothing, or nothing sensible
    (["agent", "--tools", ECHO, "--single", "hi", "--protocol", "hermes"],  # tools unseen
     "protocol hermes needs a chat template that renders tools"),
    (["agent", "--tools", ECHO, "--single", "hi", "--prompt-cache-max-bytes", "9"],
     "--prompt-cache-max-bytes needs --prompt-cache-dir"),
    (["agent", "--tools", ECHO, "--single", "hi", "--tool-env", "BAD NAME"],
     "'BAD NAME' is not an environment variable's name"),
    (["eval-bfcl", "--categories", " ,", "--out", "{tmp}/b.jsonl"], "give at least one category"),
    (["generate", "--json-schema", "{tmp}/tools.json", "--grammar", "{tmp}/tools.json", "hi"],
     "give --json-schema or --grammar, not both"),
    (["generate", "--chat", " "], "the message is empty; give the question to ask"),
    (["eval-bfcl", "--categories", "simple,multiple,simple", "--out", "{tmp}/b.jsonl"],
     "'simple' is given twice"),  # it ran twice, and --runs had each question twice
    # counts no machine holds: they ended in a segfault, a MemoryError or the OOM killer
    (["eval", "--tasks", "{tasks}", "--seeds", "99999999999"],
     "99,999,999,999 runs, more than the 1,000,000"),
    (["eval-bfcl", "--batch", "999999999", "--out", "{tmp}/b.jsonl"],
     "Invalid value for '--batch': 999999999 is not in the range 1<=x<=256"),
    (["serve", "--max-batch", "999999999"], "is not in the range 1<=x<=256"),
    (["synth", "--tools", ECHO, "--out", "{tmp}/s", "--n-train", "99999999999"],
     "is not in the range 1<=x<=100000"),
    (["specialize", "--tools", ECHO, "--out", "{tmp}/s", "--n-heldout", "99999999999"],
     "is not in the range 1<=x<=100000"),
    # the loader refuses an adapter of rank > 4096: sft wrote one (100000000: a segfault)
    (["sft", "--data", "{tasks}", "--out", "{tmp}/ad", "--rank", "5000"],
     "Invalid value for '--rank': 5000 is not in the range 1<=x<=4096"),
    # each process loads the model: 64 would have filled the memory of most machines
    (["sft", "--data", "{tasks}", "--out", "{tmp}/ad", "--batch-size", "1024",
      "--processes", "1024"], "Invalid value for '--processes': 1024 is not in the range 1<=x<="),
])
def test_bad_paths_numbers_and_text_are_one_line_before_the_work(tmp_path, args, message):
    (tmp_path / "tools.json").write_text(open(ECHO).read())
    (tmp_path / "tasks.jsonl").write_text(TASK)
    args = [a.format(tasks=tmp_path / "tasks.jsonl", tmp=tmp_path) if isinstance(a, str) else a
            for a in args]
    r = subprocess.run([*CLI, *args], capture_output=True, timeout=300)
    err = r.stderr.decode()
    assert r.returncode == 2 and err.startswith("mlx_agent: error: "), err
    assert err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks.jsonl", "tools.json"]


def test_standard_input_that_is_not_utf8_is_one_line(tmp_path):
    r = subprocess.run([*CLI, "generate", "-"], input=b"hi \xff\xfe there",
                       capture_output=True, timeout=120)
    assert r.returncode == 2 and r.stderr.decode() == \
        "mlx_agent: error: stdin is not valid UTF-8 (byte 0xff at character 3); give UTF-8 text\n"


def test_the_repl_with_json_out_keeps_stdout_json_and_outlives_a_bad_line():
    r = subprocess.run([*CLI, "agent", "--tools", ECHO, "--json-out", "--max-tokens", "8"],
                       input=b"hi \xff there\nsay hi\n:quit\n", capture_output=True, timeout=300)
    import json

    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.decode().splitlines()]  # no "you> "
    assert [e["text"] for e in events if e["type"] == "user"] == ["say hi"]
    assert events[-1]["type"] == "stats"
    assert "the line is not valid UTF-8" in r.stderr.decode()


def test_traj_show_takes_several_files_or_a_directory(tmp_path):
    import json

    for name in ("a", "b"):
        (tmp_path / f"{name}.atraj").write_text(json.dumps({
            "version": 1, "id": f"id-{name}", "summary": {},
            "steps": [{"role": "user", "content": "hi", "input_ids": [5]}]}))
    for args in ([str(tmp_path / "a.atraj"), str(tmp_path / "b.atraj")], [str(tmp_path)]):
        r = run("traj", "show", *args)
        assert r.returncode == 0, r.stderr
        assert [line for line in r.stdout.splitlines() if line.startswith("trajectory")] == \
            ["trajectory id-a", "trajectory id-b"]
    (tmp_path / "c.atraj").write_text("not json")
    (tmp_path / "d.atraj").write_text('{"version": 1, "id": "x", "st')  # cut short
    r = run("traj", "show", str(tmp_path))  # the good ones, a warning for each bad one
    assert r.returncode == 0, r.stderr
    assert [line for line in r.stdout.splitlines() if line.startswith("trajectory")] == \
        ["trajectory id-a", "trajectory id-b"]
    warnings = r.stderr.splitlines()
    assert len(warnings) == 2 and all(w.startswith("warning: skipped: ") for w in warnings)
    assert "c.atraj is not a valid" in warnings[0] and "d.atraj" in warnings[1]
    r = run("traj", "show", str(tmp_path / "c.atraj"))  # nothing to show: an error
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1
    assert r.stderr.startswith("mlx_agent: error: ") and "c.atraj is not a valid" in r.stderr


def test_eval_refuses_a_task_that_expects_a_tool_it_lacks(tmp_path):
    (tmp_path / "tools.json").write_text(open(ECHO).read())
    (tmp_path / "tasks.jsonl").write_text(TASK + TASK.replace('"echo"', '"shout"'))
    r = run("eval", "--tasks", str(tmp_path / "tasks.jsonl"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{tmp_path / 'tasks.jsonl'}:2: task 'task-2' expects a call of 'shout', which is " \
        "not one of its tools" in r.stderr
    # only calls that fit the schema count: a value it refuses, or a name it does not
    # declare, made a task that failed every run, silently
    for arguments, why in (('{"text": 5}', "text: 5 is not of type 'string'"),
                           ('{"txt": "hi"}', "txt: not one of the tool's parameters (text)")):
        (tmp_path / "tasks.jsonl").write_text(TASK.replace('{"text": "hi"}', arguments))
        r = run("eval", "--tasks", str(tmp_path / "tasks.jsonl"))
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert f"tasks.jsonl:1: task 'task-1' expects arguments no valid call of 'echo' can " \
            f"have: {why}" in r.stderr, r.stderr


def test_a_task_nested_past_the_recursion_limit_is_one_line_naming_its_line(tmp_path):
    """msgspec raises Python's RecursionError on such a line: it was a traceback."""
    (tmp_path / "tools.json").write_text(open(ECHO).read())
    deep = TASK.replace('"hi"', "[" * 100_000 + "]" * 100_000)
    (tmp_path / "tasks.jsonl").write_text(TASK + deep)
    r = run("eval", "--tasks", str(tmp_path / "tasks.jsonl"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{tmp_path / 'tasks.jsonl'}:2: not a task (JSON nested too deeply to read)" \
        in r.stderr, r.stderr


@pytest.mark.parametrize("choice,message", [
    ('"nonexistent"', "tool_choice names 'nonexistent', which is not one of the task's tools "
                      "(echo); use auto, required, none or a tool's name"),
    ('["echo", {"name": "shout"}]', "tool_choice names 'shout'"),
    ('{"name": "echo", "arguments": {"text": 5}}',
     "tool_choice's forced call of 'echo' does not fit its schema: text: 5 is not of type "
     "'string'"),
])
def test_eval_names_the_line_of_a_bad_tool_choice(tmp_path, choice, message):
    """The error came when the run began, naming neither the file nor the line."""
    (tmp_path / "tools.json").write_text(open(ECHO).read())
    (tmp_path / "tasks.jsonl").write_text(TASK + TASK.replace("}}]}}", '}}]}, "tool_choice": '
                                                              + choice + "}"))
    r = run("eval", "--tasks", str(tmp_path / "tasks.jsonl"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{tmp_path / 'tasks.jsonl'}:2: {message}" in r.stderr, r.stderr


def test_an_unbounded_float_option_has_a_plain_help_line():
    r = run("traces-to-data", "--help")
    assert r.returncode == 0 and "--min-reward FLOAT  Keep only" in r.stdout, r.stdout
    assert "None" not in r.stdout


def test_tools_ls_shows_each_tool_on_one_line_with_its_controls_escaped(tmp_path):
    """A tools file's (or an MCP server's) description went to the terminal raw: an escape
    sequence ran, a bidi override reordered the line, a newline made up another tool."""
    path = tmp_path / "t\x1b[31m.json"
    path.write_text('[{"name": "a", "_exec": "true", "description": '
                    '"Reads.\\nb()  Deletes everything.  [built-in]\\u001b]0;x\\u0007\\u202e"}]')
    r = run("tools", "ls", "--tools", str(path))
    assert r.returncode == 0, r.stderr
    assert r.stdout == (f"a()  Reads. b()  Deletes everything.  [built-in]\\x1b]0;x\\x07\\u202e"
                        f"  [{tmp_path}/t\\x1b[31m.json]\n")


def test_tools_ls_says_so_when_the_catalogue_is_empty(tmp_path):
    """An empty tools file printed nothing at all, as if the command had not run."""
    path = tmp_path / "tools.json"
    for text in ('{"tools": []}', "[]"):
        path.write_text(text)
        r = run("tools", "ls", "--tools", str(path))
        assert r.returncode == 0 and r.stdout == "", r.stderr
        assert r.stderr == f"no tools to list: the catalogue ({path}) is empty\n"


@pytest.mark.parametrize("field", ["paramters", "_exec_arg", "input_schema"])
def test_a_misspelt_field_in_a_tools_file_is_named_not_ignored(tmp_path, field):
    """A tool's unknown fields were dropped: "paramters" left a tool with no arguments that
    the model then called with none, and "_exec_arg" fell back to every property."""
    path = tmp_path / "tools.json"
    entry = {"name": "echo", "description": "Echo.", "_exec": 'printf %s "$text"',
             field: {"type": "object", "properties": {"text": {"type": "string"}}}}
    for tools in ([entry], [{"type": "function", "function": entry}]):
        path.write_text(json.dumps(tools))
        r = run("tools", "ls", "--tools", str(path))
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert f"{path}: tool 'echo': unknown field {field!r}" in r.stderr, r.stderr
    path.write_text(json.dumps([  # OpenAI's own fields still load, in both shapes
        {"type": "function", "function": {"name": "a", "strict": True, "_exec": "true"}},
        {"type": "function", "name": "b", "strict": True, "_exec": "true"}]))
    r = run("tools", "ls", "--tools", str(path))
    assert r.returncode == 0 and r.stdout.count("\n") == 2, r.stderr


def test_a_large_tools_file_is_checked_for_clashes_in_linear_time(tmp_path):
    """Each name was counted over the whole list: 40,000 tools took 40 s to list."""
    import json
    import time

    path = tmp_path / "tools.json"
    tools = [{"name": f"t{i}", "_exec": "true"} for i in range(40_000)]
    path.write_text(json.dumps(tools))
    start = time.monotonic()
    r = run("tools", "ls", "--tools", str(path), "--builtin-tools", "--root", str(tmp_path))
    assert r.returncode == 0 and r.stdout.count("\n") > 40_000, r.stderr
    assert time.monotonic() - start < 10
    path.write_text(json.dumps(tools + [{"name": "read_file", "_exec": "true"}]))
    r = run("tools", "ls", "--tools", str(path), "--builtin-tools", "--root", str(tmp_path))
    assert r.returncode == 2 and "tool 'read_file' is defined twice (a --tools entry and a " \
        "built-in)" in r.stderr, r.stderr
    path.write_text(json.dumps(tools + [{"name": "t5", "_exec": "true"}]))
    r = run("tools", "ls", "--tools", str(path))
    assert r.returncode == 2 and "tool 't5' is defined twice" in r.stderr, r.stderr


@pytest.mark.parametrize("args", [["agent", "--tools", ECHO, "--tools=x.json", "--single", "hi"],
                                  ["tools", "ls", "--tools", ECHO, "--tools", ECHO]])
def test_a_single_valued_option_given_twice_is_refused_not_half_ignored(args):
    r = run(*args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--tools is given twice; give it once (see mlx_agent " in r.stderr


def test_an_option_value_that_looks_like_an_option_is_a_value():
    r = run("generate", "--system", "-t", "-t", "0.5", "hi")  # --system's value is "-t"
    assert r.returncode == 2 and "--system needs --chat" in r.stderr, r.stderr
    r = run("generate", "-t0.5", "-t0.7", "hi")  # attached values count too
    assert r.returncode == 2 and "-t/--temperature is given twice" in r.stderr, r.stderr
    r = run("generate", "-t", "0.5", "--temperature", "0.7", "hi")  # either spelling
    assert r.returncode == 2 and "-t/--temperature is given twice" in r.stderr, r.stderr


@pytest.mark.parametrize("batch,sig", [("1", "SIGINT"), ("4", "SIGINT"), ("1", "SIGTERM")])
def test_ctrl_c_stops_eval_and_keeps_the_runs_done(tmp_path, batch, sig):
    """With --batch, the runs in the batch are cut too (not run to their end unrecorded);
    SIGTERM (a kill, a timeout) cleans up as Ctrl-C does (it lost --out, and left folders)."""
    import json
    import signal

    (tmp_path / "tools.json").write_text(open(ECHO).read())
    (tmp_path / "tasks.jsonl").write_text(TASK * 12)
    out, runs = tmp_path / "runs.jsonl", tmp_path / "traj"
    proc = subprocess.Popen([*CLI, "eval", "--tasks", str(tmp_path / "tasks.jsonl"),
                             "--out", str(out), "--trajectory-dir", str(runs),
                             "--batch", batch],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)  # as a background CI run starts it
    for line in proc.stderr:  # one progress line per finished run
        if "eval 1/12" in line:
            proc.send_signal(getattr(signal, sig))
            break
    proc.communicate(timeout=120)
    assert proc.returncode == (130 if sig == "SIGINT" else 143)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert 1 <= len(rows) < 12  # the finished runs, written; the rest not run
    assert len(list(runs.glob("*.atraj"))) == len(rows)  # no trajectory of a cut run


def test_a_kill_during_a_batched_runs_tool_stops_the_tool_at_once(tmp_path):
    """eval --batch runs each task on a worker thread, which no signal reaches: a SIGTERM
    (or Ctrl-C) waited for the workers' tools to run to their 30 s timeout."""
    import json
    import signal
    import time

    pids = tmp_path / "pids"
    (tmp_path / "tools.json").write_text(json.dumps([{
        "name": "wait", "description": "Wait a while.",
        "parameters": {"type": "object", "properties": {}},
        "_exec": f"echo $$ >> '{pids}'; exec sleep 300"}]))
    task = {"prompt": "Wait.", "tools": "tools.json", "tool_choice": "wait",
            "check": {"answer_pattern": "done"}}
    (tmp_path / "tasks.jsonl").write_text((json.dumps(task) + "\n") * 4)
    (tmp_path / "tmp").mkdir()
    out, runs = tmp_path / "runs.jsonl", tmp_path / "traj"
    proc = subprocess.Popen([*CLI, "eval", "--tasks", str(tmp_path / "tasks.jsonl"),
                             "--batch", "2", "--max-steps", "2", "--sandbox", "none",
                             "--out", str(out), "--trajectory-dir", str(runs)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    wait_for_line(pids, proc)  # a tool runs
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    took = time.monotonic() - start
    tools = [int(p) for p in pids.read_text().split()]
    try:
        assert proc.returncode == 143 and "Traceback" not in err, err
        assert took < 20, took  # at once, give or take a loaded machine; it was 30 s and more
        assert not [p for p in tools if pid_alive(p)]
        assert not out.exists() or out.read_text() == ""  # no run finished
        assert not list(runs.glob("*.atraj"))
        left = {p.name for p in (tmp_path / "tmp").iterdir()} - {"mlx"}  # MLX's compile cache
        assert not left  # the runs' working copies are removed
    finally:
        for p in tools:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


def test_an_output_that_cannot_be_written_is_one_line():
    with open("/dev/full", "w") as full:
        r = subprocess.run([*CLI, "--help"], stdout=full, stderr=subprocess.PIPE, text=True,
                           timeout=60)
    assert r.returncode == 2 and r.stderr == \
        "mlx_agent: error: cannot write the output (No space left on device)\n", r.stderr


@pytest.mark.parametrize("args, option", [
    (["synth", "--tools", "{tools}", "--no-run-tools", "--out", ""], "--out"),
    (["eval", "--tasks", "{tasks}", "--trajectory-dir", ""], "--trajectory-dir"),
    (["sft", "--data", "{tasks}", "--out", ""], "--out"),
])
def test_an_empty_output_folder_is_refused_not_the_current_one(tmp_path, args, option):
    """An empty --out (an unset "$OUT") wrote synth's files into the current directory, and
    an empty --trajectory-dir recorded nothing, without a word."""
    (tmp_path / "tools.json").write_text(open(ECHO).read())
    (tmp_path / "tasks.jsonl").write_text(TASK)
    work = tmp_path / "cwd"
    work.mkdir()
    args = [a.format(tools=tmp_path / "tools.json", tasks=tmp_path / "tasks.jsonl")
            for a in args]
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, cwd=work)
    assert r.returncode == 2 and r.stderr == \
        f"mlx_agent: error: {option} is empty; give a directory\n", r.stderr
    assert list(work.iterdir()) == []


def test_a_model_path_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "model"
    os.mkfifo(fifo)
    r = subprocess.run([*CLI, "generate", "-m", str(fifo), "hi"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr == f"mlx_agent: error: cannot read {fifo}: not a " \
        "regular file\n", r.stderr


def test_a_task_id_and_a_file_name_reach_the_progress_lines_escaped(tmp_path):
    """A tasks file's id, or a trajectory's file name, with an escape sequence in it
    retitled the window and cleared the screen from eval's and traces-to-data's progress."""
    import json

    (tmp_path / "tools.json").write_text(open(ECHO).read())
    task = json.loads(TASK) | {"id": "t\x1b]0;pwn\x07\x1b[2J"}
    (tmp_path / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    runs = tmp_path / "runs"
    r = run("eval", "--tasks", str(tmp_path / "tasks.jsonl"), "--max-tokens", "4",
            "--max-steps", "1", "--trajectory-dir", str(runs))
    assert "\x1b" not in r.stderr and "t\\x1b]0;pwn\\x07\\x1b[2J seed 0" in r.stderr, r.stderr
    (atraj,) = runs.glob("*.atraj")
    atraj.rename(runs / "a\x1b[2J.atraj")
    r = run("traces-to-data", str(runs), "--dry-run")
    assert "\x1b" not in r.stderr and "a\\x1b[2J.atraj" in r.stderr, r.stderr


def test_an_error_is_one_line_whatever_its_message_holds(capsys):
    """A library's message can list a hundred names a line each, or carry an escape
    sequence read from a hostile file (a GGUF's, a tinygpt's tokenizerSource)."""
    from mlx_agent.cli.errors import UserError

    UserError("Missing 2 parameters:\n  a.weight\n  b.weight").show()
    UserError("tokenizerSource \x1b]0;PWNED\x07 is not a directory").show()
    UserError("x" * 5000).show()
    first, second, third = capsys.readouterr().err.splitlines()
    assert first == "mlx_agent: error: Missing 2 parameters:; a.weight; b.weight"
    assert second == "mlx_agent: error: tokenizerSource \\x1b]0;PWNED\\x07 is not a directory"
    assert len(third) < 700 and third.endswith("...")


def test_the_cli_runs_in_process_off_the_main_thread_and_leaves_sigterm_as_it_was():
    """The SIGTERM handler is set on the main thread only (signal.signal raises elsewhere),
    and put back when the command ends (a later SIGTERM in the embedding process was a
    KeyboardInterrupt)."""
    import signal
    import threading

    from click.testing import CliRunner

    from mlx_agent.cli.main import main

    before = signal.getsignal(signal.SIGTERM)
    results = []
    thread = threading.Thread(target=lambda: results.append(CliRunner().invoke(main, ["--help"])))
    thread.start()
    thread.join(timeout=60)
    assert results[0].exit_code == 0, results[0].output
    assert CliRunner().invoke(main, ["--help"]).exit_code == 0
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("args,message", [
    (["/no/model"], "no model at '/no/model'"),
    (["--tools", "{tmp}/bad.json"], "bad.json: not valid JSON"),
    (["--tools", "{tmp}/no_exec.json"], "has neither '_exec' nor '_handler'"),
])
def test_bench_prefill_checks_its_input_before_the_benchmark(tmp_path, args, message):
    (tmp_path / "bad.json").write_text('{"tools": [')
    (tmp_path / "no_exec.json").write_text(json.dumps([{"type": "function", "function": {
        "name": "t", "parameters": {"type": "object", "properties": {}}}}]))
    r = run("bench", "prefill", *(a.format(tmp=tmp_path) for a in args))
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.startswith("mlx_agent: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert message in r.stderr


def test_bench_prefill_plot_without_matplotlib_fails_before_the_benchmark(tmp_path):
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        pytest.skip("matplotlib is installed")
    r = run("bench", "prefill", "--plot", str(tmp_path / "p.png"))
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr == ("mlx_agent: error: --plot needs matplotlib, which is not installed "
                        "(pip install 'mlx-agent[plot]')\n")


def test_a_bench_launch_ignores_an_mlx_agent_folder_in_the_cwd_and_fails_in_one_line(
        tmp_path, monkeypatch):
    from mlx_agent.bench import _launch
    from mlx_agent.errors import UserFacingError

    shadow = tmp_path / "shadow" / "mlx_agent"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise SystemExit('the folder shadowed the package')\n")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(shadow.parent)
    out = _launch(None, os.path.abspath(ECHO), "none", str(tmp_path / "work" / "kv"))
    assert out["mode"] == "none" and out["system_tokens"] > 0
    (tmp_path / "bad.json").write_text("{")  # read by the launch, not checked before it
    with pytest.raises(UserFacingError) as e:
        _launch(None, str(tmp_path / "bad.json"), "none", str(tmp_path / "work" / "kv"))
    assert str(e.value).startswith("the none launch failed: ") and "\n" not in str(e.value)


def test_generate_says_when_the_context_not_max_tokens_ended_it():
    r = run("generate", "-v", "--context-length", "8", "--max-tokens", "20", "one two three")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == ("warning: the context is full (8 tokens): stopped after 5 of "
                        "--max-tokens 20 (raise --context-length)")
    assert " 5 generated at " in lines[-1] and lines[-1].endswith("finish: context")
    r = run("generate", "-v", "--context-length", "8", "--max-tokens", "5", "one two three")
    assert r.returncode == 0 and "warning" not in r.stderr and \
        r.stderr.rstrip().endswith("finish: length"), r.stderr


def test_generate_help_names_the_model_variable_that_sets_the_default():
    r = run("generate", "--help")
    assert r.returncode == 0 and "$MLX_AGENT_MODEL" in " ".join(r.stdout.split())


def test_a_model_name_with_escape_sequences_is_shown_escaped(tmp_path):
    from mlx_agent.models import resolve

    hostile = tmp_path / "x\x1b]0;pwned\x07.gguf"  # the identity's name is the file's stem
    os.symlink(resolve("smollm2-135m-base"), hostile)
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "generate", "-v", "-m",
                        str(hostile), "--max-tokens", "2", "hi"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "\x1b" not in r.stderr and "\\x1b]0;pwned" in r.stderr, r.stderr


def test_serve_prints_an_ipv6_address_as_a_url_takes_it(tmp_path):
    """``--host ::1`` printed http://::1:PORT, which no client parses."""
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    path = tmp_path / "m.tinygpt"
    fmt.write(path, random_tinygpt_file())
    proc = subprocess.Popen([*CLI, "serve", str(path), "--host", "::1", "--port", "0"],
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if line.startswith("serving"):
                break
        assert "on http://[::1]:" in line, line
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("size,expected", [
    ("500000000", 500000000), ("12K", 12 << 10), ("12KiB", 12 << 10), ("10GB", 10 << 30),
    ("1.5g", 3 << 29), (" 2 M ", 2 << 20), ("0", 0)])
def test_sizes_take_binary_units(size, expected):
    from mlx_agent.cli.options import Bytes

    assert Bytes().convert(size, None, None) == expected


@pytest.mark.parametrize("size", ["abc", "1.5", "-3", "", "12X", "1e9"])
def test_a_size_that_is_not_one_is_one_line_naming_the_forms(tmp_path, size):
    r = run("cache", "prune", str(tmp_path), "--max-bytes", size)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{size!r} is not a size: give bytes (500000000) or a number with K, M, G or T" \
        in r.stderr and r.stderr.count("\n") == 1


def test_cache_prune_takes_a_size_with_a_unit(tmp_path):
    r = run("cache", "prune", str(tmp_path), "--max-bytes", "500M")
    assert r.returncode == 0 and r.stdout == "0 entries, 0 bytes left\n", r.stderr


@pytest.mark.parametrize("env,argv,hint", [
    ({"MLX_AGENT_WEIGHTS": "bad"}, ["generate", "hi"], "'--weights' (from $MLX_AGENT_WEIGHTS)"),
    ({"MLX_AGENT_SANDBOX": "nope"}, ["agent", "--tools", ECHO, "--single", "hi"],
     "'--sandbox' (from $MLX_AGENT_SANDBOX)"),
])
def test_a_bad_value_from_the_environment_names_the_variable(env, argv, hint):
    # click named only the option, which the user had not given
    r = run(*argv, env={**os.environ, **env})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"mlx_agent: error: Invalid value for {hint}: ")
    assert r.stderr.count("\n") == 1


def test_a_bad_value_of_the_option_itself_names_only_the_option():
    r = run("generate", "--weights", "bad", "hi", env={**os.environ, "MLX_AGENT_WEIGHTS": "auto"})
    assert r.returncode == 2 and "Invalid value for '--weights': 'bad'" in r.stderr


def test_a_size_too_large_for_a_float_is_exact_or_one_line(tmp_path):
    """Sizes went through float(): past 1e308 one was inf, an OverflowError traceback, and a
    big byte count lost its last digits."""
    from mlx_agent.cli.options import Bytes

    assert Bytes().convert("9007199254740993", None, None) == 9007199254740993
    assert Bytes().convert("9" * 400 + "T", None, None) == int("9" * 400) << 40
    for size, message in (("9" * 400, None), ("9" * 5000, "is too large a size")):
        r = run("cache", "prune", str(tmp_path), "--max-bytes", size)
        assert "Traceback" not in r.stderr and r.stderr.count("\n") <= 1, r.stderr[-300:]
        if message:
            assert r.returncode == 2 and message in r.stderr, r.stderr
        else:
            assert r.returncode == 0 and r.stdout == "0 entries, 0 bytes left\n", r.stderr
