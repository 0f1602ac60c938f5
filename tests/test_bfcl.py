"""eval-bfcl: BFCL's schemas converted, its checker applied to our calls, and the command
end to end with the bundled model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("bfcl_eval")

from mlx_agent.bfcl import (CATEGORIES, _schema, bfcl, openai_tools,  # noqa: E402
                             question_row, run_category)
from mlx_agent.serve.service import ChatResult, ToolCallOut, Usage  # noqa: E402
from mlx_agent.tools import declared_tools  # noqa: E402


def testbfcl_types_become_json_schema():
    mapping = bfcl().types
    params = {"type": "dict", "required": ["a", "ghost"], "optional": ["b"], "properties": {
        "a": {"type": "float", "description": "x"},
        "b": {"type": "tuple", "items": {"type": "any"}},
        "c": {"type": "dict", "properties": {"d": {"type": "integer"}}},
        "e": {"type": "array", "items": {"type": "dict", "properties": {"f": {"type": "float"}}}}}}
    (tool,) = openai_tools([{"name": "m.f", "description": "d", "parameters": params}], mapping)
    p = tool["function"]["parameters"]
    assert p["type"] == "object" and p["required"] == ["a"] and "optional" not in p
    assert p["properties"]["a"]["type"] == "number"
    assert p["properties"]["b"] == {"type": "array", "items": {"type": "string"}}
    assert p["properties"]["c"]["properties"]["d"]["type"] == "integer"
    assert p["properties"]["e"]["items"]["properties"]["f"]["type"] == "number"
    assert declared_tools([tool])[0].name == "m.f"  # a valid tool, dots and all
    assert _schema({"type": "weird"}, mapping) == {"type": "string"}


class Oracle:
    """Answers each question with the first allowed value of each ground-truth argument
    (or, for irrelevance, with a call): what BFCL's checker must score as right (wrong)."""

    tool_mode = "full"

    def __init__(self, category: str):
        b = bfcl()
        self.answers = {} if "irrelevance" in category else {
            a["id"]: a["ground_truth"] for a in b.answers(CATEGORIES[category])}
        self.questions = iter(b.questions(CATEGORIES[category], include_prereq=False))

    def prepare(self, call):
        return call

    def chat(self, call):
        q = next(self.questions)
        truth = self.answers.get(q["id"], [{call.tools[0].name: {}}])
        calls = [ToolCallOut(f"c{i}", name, {k: v[0] for k, v in args.items() if v and v[0] != ""}
                             if self.answers else args)
                 for i, one in enumerate(truth) for name, args in one.items()]
        return ChatResult(None, calls, "tool_calls", Usage())


@pytest.mark.parametrize("category,expected", [("simple", 1.0), ("parallel_multiple", 1.0),
                                               ("irrelevance", 0.0)])
def test_checker_scores_our_calls_inbfcl_format(category, expected):
    score = run_category(Oracle(category), category, limit=6)
    assert (score.n, score.accuracy, score.parse_errors) == (6, expected, 0)


def test_question_rows_are_eval_rows():
    """eval-bfcl --runs: one row per question, shaped as eval --out's rows."""
    items = []
    run_category(Oracle("simple"), "simple", limit=3, on_item=items.append)
    rows = [question_row(item) for item in items]
    assert [r["task"] for r in rows] == ["simple_python_0", "simple_python_1", "simple_python_2"]
    assert all(r["seed"] == 0 and r["reward"] == 1.0 and r["calls"] == 1 and r["seconds"] >= 0
               and "error" not in r for r in rows)
    assert set(rows[0]) == {"task", "seed", "reward", "calls", "turns", "answered",
                            "seconds"}


@pytest.mark.real_model
def test_evalbfcl_end_to_end_with_the_bundled_model(tmp_path):
    out = tmp_path / "bfcl.jsonl"
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "eval-bfcl",
                        "--categories", "simple,irrelevance", "--limit", "5",
                        "--max-tokens", "48", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(x["category"], x["n"], x["tool_mode"]) for x in rows] == \
        [("simple", 5, "full"), ("irrelevance", 5, "full")]
    assert all(0 <= x["accuracy"] <= 1 and x["seconds"] > 0 for x in rows)
    assert "simple" in r.stdout and "mean" in r.stdout


def test_evalbfcl_rejects_an_unknown_category(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "eval-bfcl",
                        "--categories", "simple,exec", "--out", str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown category 'exec'" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "x").exists()
