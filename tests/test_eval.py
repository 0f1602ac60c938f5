"""`eval` on three tiny tasks driven by a scripted sampler: the rewards are known."""

from __future__ import annotations

import json
import os

import pytest

from mlx_agent import trajectory as tj
from mlx_agent.evaluate import load_tasks, run

from .test_agent_loop import Script

TOOLS = [{"name": "echo", "description": "Echo text", "_exec": 'printf "%s" "$text"',
          "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                         "required": ["text"]}}]


def test_eval_rewards_trajectories_and_table(tiny_lm, tmp_path):
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    (tmp_path / "fx").mkdir()
    (tmp_path / "fx" / "seed.txt").write_text("x")
    tasks = [
        {"id": "call", "prompt": "echo hi", "tools": "tools.json",
         "check": {"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]}},
        {"id": "write", "prompt": "write done to out.txt", "builtin_tools": True, "fixture": "fx",
         "check": {"shell": "grep -q done out.txt && test -f seed.txt"}},
        {"id": "answer", "prompt": "capital?", "tools": "tools.json",
         "check": {"answer_pattern": "^Paris$"}},
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in tasks))
    replies = {
        0: ['{"tool": "echo", "arguments": {"text": "hi"}}', '{"answer": "ok"}',
            '{"tool": "write_file", "arguments": {"path": "out.txt", "content": "done"}}',
            '{"answer": "written"}', '{"answer": "Paris"}'],
        1: ['{"tool": "echo", "arguments": {"text": "bye"}}', '{"answer": "ok"}',
            '{"answer": "I did not write it"}', '{"answer": "Lyon"}'],
    }
    scripts = {seed: Script(tiny_lm, *r) for seed, r in replies.items()}  # one per seed
    summary = run(tiny_lm, path, seeds=2, trajectory_dir=tmp_path / "runs",
                  config_overrides={"grammar": False}, sampler_for=scripts.__getitem__)
    assert [(r.task, r.seed, r.reward) for r in summary.runs] == [
        ("call", 0, 1.0), ("call", 1, 0.0), ("write", 0, 1.0), ("write", 1, 0.0),
        ("answer", 0, 1.0), ("answer", 1, 0.0)]
    row = summary.row()
    assert row["success"] == 0.5 and row["valid_calls"] == 1.0 and row["mean_calls"] == 0.5
    assert row["cache_share"] > 0.3  # the shared system prompt was prefilled once
    rewards = sorted(float(t.summary["reward"]) for _, t in tj.iter_dir(tmp_path / "runs"))
    assert rewards == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert not (tmp_path / "fx" / "out.txt").exists()  # each run had its own copy


def test_task_file_errors(tmp_path):
    import pytest

    bad = tmp_path / "t.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "tools": "t.json", "check": {}}))
    with pytest.raises(ValueError, match="exactly one check"):
        load_tasks(bad)
    bad.write_text(json.dumps({"prompt": "x", "check": {"shell": "true"}}))
    with pytest.raises(ValueError, match="needs tools or builtin_tools"):
        load_tasks(bad)
    # ids name a run's rows and trajectories and order them: an explicit one that repeats
    # the id line 2 would get was taken
    task = {"prompt": "x", "tools": "t.json", "check": {"shell": "true"}}
    bad.write_text(json.dumps({**task, "id": "task-2"}) + "\n" + json.dumps(task) + "\n")
    with pytest.raises(ValueError, match=r"t.jsonl:2: task id 'task-2' is the id of line 1"):
        load_tasks(bad)
    # found when the file is read, not after the model ran every task
    for arguments in ("x", [1]):
        bad.write_text(json.dumps({"prompt": "x", "tools": "t.json", "check": {
            "tool_calls": [{"name": "echo", "arguments": arguments}]}}))
        with pytest.raises(ValueError, match="each expected tool call needs"):
            load_tasks(bad)
    # a shell check of no command exits 0: every run passed, whatever the model did
    for shell in ("", "  "):
        bad.write_text(json.dumps({"prompt": "x", "tools": "t.json", "check": {"shell": shell}}))
        with pytest.raises(ValueError, match="t.jsonl:1: the shell check is empty"):
            load_tasks(bad)
    (tmp_path / "a_file").write_text("")
    for fixture in ("missing", "a_file"):
        bad.write_text(json.dumps({"prompt": "x", "tools": "t.json", "fixture": fixture,
                                   "check": {"answer_pattern": "x"}}))
        with pytest.raises(ValueError, match=f"fixture '{fixture}' is not a directory"):
            load_tasks(bad)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        load_tasks(fifo)  # refused at once: reading it would wait for a writer
    # a fixture is copied for every run: a FIFO in it was a traceback, a device node (as
    # /dev/zero) copied until the disk filled
    (tmp_path / "fx").mkdir()
    os.mkfifo(tmp_path / "fx" / "pipe")
    bad.write_text(json.dumps({"prompt": "x", "tools": "t.json", "fixture": "fx",
                               "check": {"answer_pattern": "x"}}))
    with pytest.raises(ValueError, match="fixture 'fx' cannot be copied: .*pipe: not a "
                                         "regular file, folder or link"):
        load_tasks(bad)


def test_a_tasks_file_past_the_size_limit_is_refused_before_it_is_read(tmp_path):
    import pytest

    from mlx_agent.evaluate import MAX_TASKS_FILE_BYTES

    path = tmp_path / "t.jsonl"
    with open(path, "wb") as f:
        f.truncate(MAX_TASKS_FILE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(ValueError, match=f"cannot read {path}: it is "
                                         f"{MAX_TASKS_FILE_BYTES + 1:,} bytes, over the 256 MiB"):
        load_tasks(path)


def test_task_files_are_cut_at_newlines_only(tmp_path):
    """U+2028, U+0085, \\x1c and the like stay raw inside JSON strings (synth writes them
    with ensure_ascii=False): str.splitlines cut a task in two there. A byte-order mark and
    CRLF line ends are read too."""
    path = tmp_path / "t.jsonl"
    odd = "a\u2028b\u2029c\x85d\x1ce\x0bf\x0cg"
    rows = [{"prompt": f"say {odd}", "builtin_tools": True, "check": {"answer_pattern": "x"}},
            {"prompt": "two", "builtin_tools": True, "check": {"answer_pattern": "y"}}]
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(
        json.dumps(r, ensure_ascii=False) for r in rows).encode())
    assert [t.prompt for t in load_tasks(path)] == [f"say {odd}", "two"]


def test_a_rerun_of_the_same_prompt_records_its_whole_prompt(tiny_lm, tmp_path):
    """Seed 1 finds seed 0's prompt in the engine's cache; its trajectory still replays to
    the whole conversation (it lacked the user message: the cached part was left out)."""
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "echo hi", "tools": "tools.json",
                                "check": {"answer_pattern": "."}}))
    summary = run(tiny_lm, path, seeds=2, trajectory_dir=tmp_path / "runs",
                  config_overrides={"max_tokens": 8, "max_steps": 1})
    (_, first), (_, second) = sorted(tj.iter_dir(tmp_path / "runs"),
                                     key=lambda p: p[1].sampling["seed"])
    assert summary.runs[1].reused > len(second.steps[0].input_ids)  # the cache held more
    assert second.replay() == first.replay()  # greedy: the same tokens, the same mask
    assert tiny_lm.decode(second.token_sequence()).count("echo hi") == 1


def test_the_example_task_sets_load():
    from pathlib import Path

    files = Path(__file__).resolve().parent.parent / "examples" / "files" / "tasks.jsonl"
    tasks = load_tasks(files)
    assert len(tasks) == 10 and all(t.builtin_tools and t.fixture == "fixture" for t in tasks)
    assert len({t.id for t in tasks}) == 10


def test_a_runs_row_counts_tool_errors_guarded_and_retried_steps(tiny_lm, tmp_path):
    from .test_loop_guard import Obliging

    tools = [{"name": "ping", "description": "Ping", "_exec": "echo pong",
              "parameters": {"type": "object", "properties": {}}},
             {"name": "fail", "description": "Fails", "_exec": "exit 3",
              "parameters": {"type": "object", "properties": {}}}]
    (tmp_path / "tools.json").write_text(json.dumps(tools))
    (tmp_path / "tasks.jsonl").write_text(json.dumps(
        {"id": "t", "prompt": "go", "tools": "tools.json", "check": {"answer_pattern": "pong"}}))
    call = '{{"tool":"{}","arguments":{{}}}}'.format
    # fail, then an answer refused (a retry), ping, ping again (guarded), the answer
    script = [call("fail"), '{"answer":"gave up"}', call("ping"), call("ping"),
              '{"answer":"pong"}']
    summary = run(tiny_lm, tmp_path / "tasks.jsonl",
                  sampler_for=lambda seed: Obliging(tiny_lm, *script))
    (result,) = summary.runs
    row = result.row()
    assert (row["reward"], row["calls"], row["answered"]) == (1.0, 2, True)
    # the guard masked tokens in the retried step (fail had run) and in ping's repeat
    assert (row["tool_errors"], row["guarded_steps"], row["retried_steps"]) == (1, 2, 1)


def test_an_answer_pattern_that_backtracks_for_ever_is_no_match_not_a_hang(tmp_path):
    import time

    from mlx_agent.evaluate import Check, Task, passed

    def check(pattern: str, answer: str, timeout: float = 60.0) -> bool:
        task = Task(prompt="x", check=Check(answer_pattern=pattern), tools="t.json")
        return passed(task, tmp_path, [], answer, timeout=timeout)

    assert check("^Par", "Paris") and not check("^Lyon$", "Paris")
    start = time.monotonic()
    assert not check("^(.|.)*QQQ$", "a" * 64, timeout=1.0)  # 2^64 paths to try
    assert time.monotonic() - start < 10


def test_a_run_whose_prompt_overflows_the_context_says_why_in_its_row(tiny_lm, tmp_path):
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    (tmp_path / "tasks.jsonl").write_text(json.dumps(
        {"id": "long", "prompt": "word " * (tiny_lm.context_length + 10), "tools": "tools.json",
         "check": {"answer_pattern": "x"}}))
    summary = run(tiny_lm, tmp_path / "tasks.jsonl",
                  sampler_for=lambda seed: Script(tiny_lm, '{"answer":"x"}'))
    (result,) = summary.runs
    row = result.row()
    assert (row["reward"], row["answered"]) == (0.0, False)
    assert f"exceed the {tiny_lm.context_length}-token context" in row["error"]


def test_a_run_that_passed_before_the_context_filled_is_not_called_failed(tiny_lm, tmp_path):
    """The early-stop reason went into ``error``, and the progress line of a run that had
    made its expected call read "✓ call seed 0: ... (failed: 2204 tokens exceed ...)"."""
    from mlx_agent.cli.fanout import run_line

    noisy = [{**TOOLS[0], "_exec": "head -c 100000 /dev/zero | tr '\\0' 'a '"}]
    (tmp_path / "tools.json").write_text(json.dumps(noisy))
    (tmp_path / "tasks.jsonl").write_text(json.dumps(
        {"id": "call", "prompt": "echo hi", "tools": "tools.json",
         "check": {"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]}}))
    summary = run(tiny_lm, tmp_path / "tasks.jsonl", config_overrides={"grammar": False},
                  sampler_for=lambda seed: Script(
                      tiny_lm, '{"tool": "echo", "arguments": {"text": "hi"}}', '{"answer":"x"}'))
    (result,) = summary.runs
    assert result.reward == 1.0 and "-token context" in result.error
    line = run_line(result)
    assert line.startswith("✓ call seed 0: 1 calls") and "(stopped early: " in line, line
    assert "failed" not in line


def test_an_answer_pattern_check_that_cannot_start_is_one_clear_error(monkeypatch):
    """It raised OSError from the check's process (a traceback), or scored a miss."""
    import sys

    from mlx_agent.errors import UserFacingError
    from mlx_agent.evaluate import _search

    assert _search("a+b", "xaab", 10) and not _search("q", "x", 10)
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    with pytest.raises(UserFacingError, match="answer_pattern check could not start"):
        _search("a", "a", 10)
