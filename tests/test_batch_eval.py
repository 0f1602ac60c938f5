"""`eval --batch N` and `eval-bfcl --batch N`: the same greedy rollouts as one at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mlx_agent import trajectory as tj
from mlx_agent.evaluate import run

TOOLS = [{"name": "echo", "description": "Echo text", "_exec": 'printf "%s" "$text"',
          "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                         "required": ["text"]}}]
WORDS = ["hi", "the weather in Paris", "echo banana", "say 42", "nothing", "what is 2+2?",
         "call echo with x", "list files", "a very long request about many things", "bye"]


def _tasks(tmp_path, n: int = 10):
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(
        {"id": f"t{i}", "prompt": WORDS[i % len(WORDS)], "tools": "tools.json",
         "check": {"answer_pattern": "a"}}) for i in range(n)))
    return path


def _ids(directory) -> dict[str, list[int]]:
    return {t.task: t.token_sequence() for _, t in tj.iter_dir(directory)}


def test_each_trajectory_replays_its_whole_prompt(tiny_lm, tmp_path):
    """The second task reused the first's "<|im_end|>\n<|im_start|>user\n" from the cache;
    its trajectory left those ids out, so its replay was not what the cache held."""
    path = _tasks(tmp_path, n=3)
    run(tiny_lm, path, trajectory_dir=tmp_path / "b1",
        config_overrides={"max_steps": 1, "max_tokens": 4})
    for i, (task, ids) in enumerate(sorted(_ids(tmp_path / "b1").items())):
        assert f"<|im_end|>\n<|im_start|>user\n{WORDS[i]}<|im_end|>" in \
            tiny_lm.tokenizer.decode(ids)


def test_eval_batch_8_gives_the_ids_of_batch_1(tiny_lm, tmp_path):
    path = _tasks(tmp_path)
    overrides = {"max_steps": 2, "max_tokens": 24}
    one = run(tiny_lm, path, trajectory_dir=tmp_path / "b1", config_overrides=overrides)
    seen = []
    eight = run(tiny_lm, path, trajectory_dir=tmp_path / "b8", config_overrides=overrides,
                batch=8, on_run=lambda r: seen.append(r.task))
    assert [r.task for r in eight.runs] == [r.task for r in one.runs]  # summary in task order
    assert sorted(seen) == sorted(r.task for r in one.runs)
    assert [(r.answer, r.calls, r.turns, r.reward) for r in eight.runs] == \
        [(r.answer, r.calls, r.turns, r.reward) for r in one.runs]
    assert sum(r.calls for r in one.runs) > 0  # tools ran between steps
    ids1, ids8 = _ids(tmp_path / "b1"), _ids(tmp_path / "b8")
    assert len(ids1) == 10 and ids1 == ids8
    assert eight.row()["cache_share"] > 0.3  # the system prompt came from the shared prefix


@pytest.mark.real_model
def test_eval_cli_batch_prints_progress_lines(tmp_path):

    path = _tasks(tmp_path, n=3)
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "eval", "--tasks", str(path),
                        "--batch", "3", "--max-steps", "1", "--max-tokens", "8"],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "MLX_AGENT_PROGRESS": ""})
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("eval ")]
    assert [x.split()[1] for x in lines] == ["1/3", "2/3", "3/3"]
    assert "runs" in r.stdout and "success" in r.stdout


def test_eval_batch_must_be_positive(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "eval", "--tasks",
                        str(_tasks(tmp_path, 1)), "--batch", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--batch" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.real_model
def test_evalbfcl_batch_agrees_with_batch_1(tmp_path):
    pytest.importorskip("bfcl_eval")
    out = {}
    for batch in (1, 4):
        f = tmp_path / f"b{batch}.jsonl"
        r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "eval-bfcl",
                            "--categories", "simple", "--limit", "6", "--max-tokens", "48",
                            "--batch", str(batch), "--out", str(f),
                            "--runs", str(tmp_path / f"runs{batch}.jsonl")],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        assert "simple 6/6 100%" in r.stderr  # progress lines on a pipe
        out[batch] = json.loads(f.read_text())
        runs = (tmp_path / f"runs{batch}.jsonl").read_text().splitlines()
        # in question order, as they finished or not (batch 4 finished _1 first)
        assert [json.loads(line)["task"] for line in runs] == \
            [f"simple_python_{i}" for i in range(6)]
    assert out[1]["accuracy"] == out[4]["accuracy"] and out[4]["n"] == 6


def test_encodes_in_threads_keep_special_tokens_apart(tiny_lm):
    """transformers sets split_special_tokens as a flag on the shared tokenizer for the call:
    eval --batch's threads tokenized "<|im_start|>" as text now and then."""
    import threading

    template, text = "<|im_end|>\n<|im_start|>user\n" * 4, "say <|im_start|> please " * 4
    want = (tiny_lm.encode(template), tiny_lm.encode_text(text))
    bad = []

    def hammer(i):
        for _ in range(300):
            got = tiny_lm.encode(template) if i % 2 else tiny_lm.encode_text(text)
            if got != want[0 if i % 2 else 1]:
                bad.append(i)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
