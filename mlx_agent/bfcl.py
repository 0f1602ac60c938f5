"""``eval-bfcl``: the Berkeley Function Calling Leaderboard's AST categories, in process.

Questions, possible answers and the AST checker come from the ``bfcl-eval`` package
(installed with ``--no-deps``). Each question's functions become OpenAI tools (BFCL's types
mapped as its own OpenAI handler maps them: ``dict`` -> object, ``float`` -> number, ...;
names keep their dots, which our server accepts), the :class:`~mlx_agent.serve.ChatService`
answers with the grammar on, and the reply's tool calls are checked by BFCL's
``ast_checker``. Irrelevance categories pass when the model calls nothing.

Not promised: the executable, multi-turn, agentic or Java/JavaScript categories, or
BFCL's prompting (the model sees its own chat format and our tool protocol).
"""

from __future__ import annotations

import sys
import time
import types
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Sequence

from .batch_runner import run_pool
from .engine import SamplingParams
from .errors import UserFacingError
from .serve.service import ChatCall
from .tools import declared_tools

CATEGORIES = {  # the name on the command line -> BFCL v4's test category
    "simple": "simple_python", "multiple": "multiple", "parallel": "parallel",
    "parallel_multiple": "parallel_multiple", "irrelevance": "irrelevance",
    "live_simple": "live_simple", "live_multiple": "live_multiple",
    "live_parallel": "live_parallel", "live_parallel_multiple": "live_parallel_multiple",
    "live_irrelevance": "live_irrelevance",
}


class BFCLMissing(UserFacingError, RuntimeError):
    """bfcl-eval is not installed."""


def bfcl():
    """BFCL's loaders and checker. Its ``model_config`` module imports every vendor SDK;
    the checker only asks it whether a model turns '.' into '_' in names, and ours does not,
    so a stand-in answers that instead."""
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        stub = types.ModuleType(name)

        class _Config(dict):
            def __missing__(self, key):
                return types.SimpleNamespace(underscore_to_dot=False)

        stub.MODEL_CONFIG_MAPPING = _Config()
        sys.modules[name] = stub
    try:
        from bfcl_eval.constants.enums import Language
        from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
        from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry
    except ImportError as e:
        raise BFCLMissing(f"bfcl-eval is not installed ({e}); run `make install`, or "
                          "`pip install --no-deps bfcl-eval`") from None
    return types.SimpleNamespace(Language=Language, types=GORILLA_TO_OPENAPI,
                                 ast_checker=ast_checker, questions=load_dataset_entry,
                                 answers=load_ground_truth_entry)


def _schema(node: Any, mapping: dict) -> Any:
    """A BFCL parameter schema as JSON Schema (its types mapped, recursively)."""
    if isinstance(node, list):
        return [_schema(v, mapping) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str):
            out[key] = mapping.get(value, "string")
        elif key == "properties" and isinstance(value, dict):
            out[key] = {k: _schema(v, mapping) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "anyOf", "oneOf"):
            out[key] = _schema(value, mapping)
        elif key == "optional":  # BFCL's own field, not JSON Schema
            continue
        else:
            out[key] = value
    if "properties" in out and "required" in out:
        out["required"] = [r for r in out["required"] if r in out["properties"]]
    return out


def openai_tools(functions: list[dict], mapping: dict) -> list[dict]:
    tools = []
    for f in functions:
        params = _schema(f.get("parameters", {}), mapping)
        params["type"] = "object"
        tools.append({"type": "function", "function": {
            "name": f["name"], "description": f.get("description", ""), "parameters": params}})
    return tools


@dataclass
class CategoryScore:
    category: str
    tool_mode: str
    accuracy: float
    n: int
    parse_errors: int
    mean_hops: float
    seconds: float


def run_category(service, category: str, limit: int | None = None, max_tokens: int = 256,
                 on_item: Callable[[dict], None] = lambda r: None,
                 at_once: int = 1, cancel: Callable[[], None] | None = None) -> CategoryScore:
    """Score ``service`` on one category (its first ``limit`` questions); with ``at_once``
    > 1 (a service with that many lanes on a :class:`~mlx_agent.batch_runner.BatchRunner`),
    that many questions go to it from threads of their own and decode in one batch, and
    ``cancel`` (the runner's) ends them on Ctrl-C. ``on_item`` gets each question's row as
    it is scored."""
    questions = category_questions(category, limit)
    start = time.perf_counter()
    types, judge = bfcl().types, Judge(category)
    if at_once <= 1:
        rows = [judge(q, answer_question(service, q, types, max_tokens), on_item)
                for q in questions]
        return judge.summary(service.tool_mode, rows, start)
    rows: list = [None] * len(questions)

    def done(i: int, answer: tuple) -> None:
        rows[i] = judge(questions[i], answer, on_item)

    run_pool([service] * at_once, questions,
             lambda svc, q: answer_question(svc, q, types, max_tokens), on_done=done,
             cancel=cancel)
    return judge.summary(service.tool_mode, rows, start)


def category_questions(category: str, limit: int | None = None) -> list[dict]:
    """The first ``limit`` questions of a category (all without it)."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; choose from "
                         + ", ".join(CATEGORIES))
    questions = bfcl().questions(CATEGORIES[category], include_prereq=False)
    return questions[:limit] if limit else questions


def answer_question(service, q: dict, types: dict, max_tokens: int) -> tuple:
    """Put one question to ``service``: its calls, hops, the error that kept it from the
    model (None if it was put) and its seconds."""
    start = time.perf_counter()
    calls, hop, error = [], 0, None
    try:
        result = service.chat(service.prepare(ChatCall(
            messages=[{"role": m["role"], "content": m["content"]} for m in q["question"][0]],
            tools=declared_tools(openai_tools(q["function"], types)), max_tokens=max_tokens,
            sampling=SamplingParams())))
        calls = [{c.name: c.arguments} for c in result.tool_calls]
        hop = result.hops
    except UserFacingError as e:
        error = str(e)
    return calls, hop, error, time.perf_counter() - start


class Judge:
    """BFCL's checker for one category: a question's answer (from :func:`answer_question`)
    becomes its row; the rows become the :class:`CategoryScore`."""

    def __init__(self, category: str):
        self.b, self.category = bfcl(), category
        self.test_category = CATEGORIES[category]
        self.irrelevance = "irrelevance" in self.test_category
        self.truth = {} if self.irrelevance else {
            a["id"]: a["ground_truth"] for a in self.b.answers(self.test_category)}

    def __call__(self, q: dict, answer: tuple, on_item: Callable[[dict], None]) -> dict:
        calls, hop, error, seconds = answer
        # no answer to check: the question could not be put to the model, or no call came
        parse_error = error is not None or (not self.irrelevance and not calls)
        if parse_error:
            ok = False
        elif self.irrelevance:
            ok = not calls
        else:
            check = self.b.ast_checker(q["function"], calls, self.truth[q["id"]],
                                       self.b.Language.PYTHON, self.test_category, "mlx_agent")
            ok = bool(check["valid"])
        row = {"id": q["id"], "ok": ok, "calls": calls, "hops": hop, "error": error,
               "seconds": seconds, "parse_error": parse_error}
        on_item(row)
        return row

    def summary(self, tool_mode: str, rows: list[dict], start: float) -> CategoryScore:
        n = len(rows)
        return CategoryScore(category=self.category, tool_mode=tool_mode,
                             accuracy=sum(r["ok"] for r in rows) / n if n else 0.0, n=n,
                             parse_errors=sum(r["parse_error"] for r in rows),
                             mean_hops=sum(r["hops"] for r in rows) / n if n else 0.0,
                             seconds=round(time.perf_counter() - start, 2))


def score(category: str, tool_mode: str, questions: list[dict], answers: Iterable[tuple],
          start: float, on_item: Callable[[dict], None] = lambda r: None) -> CategoryScore:
    """BFCL's checker on each question's answer (from :func:`answer_question`, in order)."""
    judge = Judge(category)
    rows = [judge(q, answer, on_item) for q, answer in zip(questions, answers)]
    return judge.summary(tool_mode, rows, start)


def question_row(item: dict) -> dict:
    """A question's row in ``eval-bfcl --runs``, as ``eval --out`` writes a run's (less its
    tool counts: BFCL's calls are scored, not run): the same however the questions were
    distributed, apart from ``seconds``."""
    row = {"task": item["id"], "seed": 0, "reward": float(item["ok"]),
           "calls": len(item["calls"]), "turns": item["hops"],
           "answered": not item["calls"], "seconds": round(item["seconds"], 3)}
    return row | ({"error": item["error"]} if item["error"] else {})


def as_row(score: CategoryScore) -> dict:
    return asdict(score)
