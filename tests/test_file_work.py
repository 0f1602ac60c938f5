"""Everyday file work (mlx_agent.synth.file_work): generated folders, requests over them and
conversations whose calls ran for real and whose answers hold what the result said."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest

from mlx_agent.synth.file_work import conversations, file_tasks, make_folder
from mlx_agent.tools import builtin_tools

ROOT = Path(__file__).resolve().parent.parent
HELD_OUT = ROOT / "examples" / "files"


def made(tmp_path: Path, seed: int, n: int = 24, where: str = "", **shares):
    folder = tmp_path / f"folder{seed}{where}"
    folder.mkdir()
    rng = random.Random(seed)
    files = make_folder(folder, rng)
    tasks = file_tasks(files, rng, n, **shares)
    return folder, files, conversations(builtin_tools(tmp_path), folder, tasks)


def test_folder_on_disk_is_what_it_returns(tmp_path):
    folder, files, _ = made(tmp_path, 1)
    on_disk = {p.relative_to(folder).as_posix(): p.read_text()
               for p in folder.rglob("*") if p.is_file()}
    assert on_disk == files and 3 <= len(files) <= 7


def test_deterministic_under_the_seed(tmp_path):
    a, b = made(tmp_path, 7, where="a"), made(tmp_path, 7, where="b")
    assert a[1] == b[1]
    assert [m for _, m in a[2]] == [m for _, m in b[2]]
    assert made(tmp_path, 8)[1] != a[1]


def test_answers_hold_the_real_result(tmp_path):
    kinds = Counter()
    for seed in range(12):
        folder, files, convs = made(tmp_path, seed)
        for task, (user, call, result, answer) in convs:
            kinds[task.kind] += 1
            assert user["role"] == "user" and answer["role"] == "assistant"
            function = call["tool_calls"][0]["function"]
            args = json.loads(function["arguments"])
            stdout = json.loads(result["content"])["stdout"]
            said = answer["content"]
            if task.kind in ("fact", "first"):
                # what the answer quotes is in the file the call read
                quoted = re.findall(r'"([^"]+)"', said) or [said.rsplit(" is ", 1)[-1][:-1]]
                assert all(q in stdout for q in quoted), (said, stdout)
            elif task.kind == "show":
                assert stdout.strip() in said and stdout == files[args["path"]]
            elif task.kind == "lines":
                assert f"has {len(stdout.splitlines())} line" in said
            elif task.kind == "list":
                assert all(name in said for name in stdout.split())
            elif task.kind == "search":
                hits = {line.split(":", 1)[0] for line in stdout.splitlines() if ":" in line}
                assert all(h in said for h in hits)
                assert said.startswith("No file") == (stdout == "no matches") == (not hits)
            elif task.kind == "mentions":
                assert said.startswith("Yes") == (stdout != "no matches")
                if stdout != "no matches":  # the line it quotes is the match
                    assert said.split(": ", 1)[1].strip('"') in stdout
            else:
                assert task.kind == "write" and args["content"] in said
                assert stdout == f"wrote {len(args['content'].encode())} bytes to {args['path']}"
            assert task.prompt == user["content"]
    assert set(kinds) == {"fact", "show", "first", "lines", "list", "search", "mentions",
                          "write"}


def test_writes_leave_the_folder_alone(tmp_path):
    folder, files, convs = made(tmp_path, 3, n=40)
    assert any(t.kind == "write" for t, _ in convs)
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert on_disk == set(files)  # each call ran on a fresh copy


@pytest.mark.parametrize("shares", [{}, {"slip_share": 0.4, "missing_share": 0.1}])
@pytest.mark.parametrize("seed", range(10))
def test_held_out_file_set_shares_no_request_or_name(tmp_path, seed, shares):
    """examples/files holds the hand-written file sets (tasks*.jsonl, each over its own
    fixture): no generated request is one of their requests, and no generated folder has
    their files or the first set's marked words."""
    held = [json.loads(line) for tasks in sorted(HELD_OUT.glob("tasks*.jsonl"))
            for line in tasks.read_text().splitlines()]
    assert len(held) >= 50
    prompts = {t["prompt"] for t in held}
    held_files = {p.relative_to(fixture).as_posix() for fixture in HELD_OUT.glob("fixture*")
                  for p in fixture.rglob("*") if p.is_file()}
    folder, files, convs = made(tmp_path, seed, **shares)
    assert not prompts & {t.prompt for t, _ in convs}
    assert not held_files & set(files)
    text = " ".join(files.values()) + " ".join(t.prompt for t, _ in convs)
    assert not re.search(r"\b(Dana|Falcon|TODO|launch date)\b", text, re.IGNORECASE)


def test_slips_fail_and_the_call_after_them_recovers(tmp_path):
    """``slip_share``: a mistaken call (a misspelt path, a folder read as a file, a made-up
    folder to search) really fails, the task's own call then succeeds, and only the
    mistake is left untrained; ``missing_share``: a file that is not there, read for real,
    and an answer that says so."""
    kinds = Counter()
    for seed in range(8):
        folder, files, convs = made(tmp_path, seed, n=30, slip_share=0.5, missing_share=0.15)
        for task, messages in convs:
            results = [json.loads(m["content"]) for m in messages if m["role"] == "tool"]
            kinds[task.kind.split("-")[-1]] += 1
            if task.slip:
                assert task.kind.endswith("-recovered") and task.untrained == (1,)
                assert [m["role"] for m in messages] == [
                    "user", "assistant", "tool", "assistant", "tool", "assistant"]
                assert results[0]["exit_code"] != 0 and results[1]["exit_code"] == 0
                function = messages[1]["tool_calls"][0]["function"]
                assert task.slip == (function["name"], json.loads(function["arguments"]))
                assert task.slip != task.call
            elif task.fails:
                path = task.call[1]["path"]
                assert path not in files and results[0]["exit_code"] != 0
                stem = path.rpartition(".")[0]  # unlike any file's name, not a slip's
                assert all(stem.rstrip("s") != f.rpartition("/")[2].rpartition(".")[0]
                           .rstrip("s") for f in files)
                assert path in messages[-1]["content"] and task.untrained == ()
            else:
                assert results[0]["exit_code"] == 0 and task.untrained == ()
    assert kinds["recovered"] > 20 and kinds["missing"] > 10


def test_a_file_rows_mask_leaves_the_mistake_out(tmp_path, tiny_lm):
    from mlx_agent.formats import make_format
    from mlx_agent.written_rows import conversation_row

    folder, files, convs = made(tmp_path, 2, n=30, slip_share=0.5)
    tools = builtin_tools(tmp_path)
    fmt = make_format("json", tiny_lm)
    task, messages = next((t, m) for t, m in convs if t.slip)
    row = conversation_row(tiny_lm, fmt, tools, messages, task.untrained)
    learned = tiny_lm.decode([t for t, m in zip(row["input_ids"], row["loss_mask"]) if m])
    mistake = json.loads(messages[1]["tool_calls"][0]["function"]["arguments"])
    right = json.loads(messages[3]["tool_calls"][0]["function"]["arguments"])
    assert learned.count(json.dumps(mistake, separators=(",", ":"))[1:-1]) == 0
    assert json.dumps(right, separators=(",", ":"))[1:-1] in learned
