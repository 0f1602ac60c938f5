"""Compare variants of the json protocol's prompt and grammar on synthetic and BFCL tasks.

    .venv/bin/python scripts/prompt_variants.py --variants main,shipped-spaced \\
        --tasks build/synth/calc/heldout.jsonl --task-limit 20 --bfcl-limit 20 --out v.jsonl

A variant is named ``WORDING-SPACING[-ORDER-order]`` (see :func:`parse`; ``main`` is main's
own, ``shipped-mixed``), three choices:

- the wording of the lines after the tool list (:data:`WORDINGS`; ``{call}`` and
  ``{answer}`` are the reply's shapes),
- the spacing of the JSON: ``spaced`` (``", "`` and ``": "`` in the prompt's examples and
  in the grammar), ``compact`` (``","`` and ``":"`` in both) or ``mixed`` (spaced examples,
  compact grammar: main's),
- the order of a call's arguments: ``main`` (the default: the grammar follows the schema's
  properties, the prompt lists required first), ``prompt`` (both: required first, optional
  alphabetically) or ``declared`` (both: the schema's order).

Each variant is applied by setting the module-level choices of
:mod:`mlx_agent.formats.json_format` and :mod:`mlx_agent.grammar` (this script's business
only: the library has one setting, the chosen one) and clearing the grammar caches; then the
model runs greedy, grammar on, over the first ``--task-limit`` tasks of each ``--tasks``
file (``mlx_agent eval``'s format, e.g. the held-out file of ``mlx_agent synth``) and the first
``--bfcl-limit`` questions of each BFCL category. One JSON row per variant goes to ``--out``
(rewritten after each), and a table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path

import mlx_agent  # noqa: F401  (fast BLAS before mlx)
from mlx_agent import bfcl, evaluate, grammar
from mlx_agent.fileio import write_jsonl
from mlx_agent.formats import json_format
from mlx_agent.models import load
from mlx_agent.serve import ChatService
from mlx_agent.tools import Tool

WORDINGS = {
    "shipped": (  # main's lines
        "When you need a tool, reply with a single JSON object and nothing else:",
        "{call}",
        "The tool's result then comes back to you in a tool message.",
        "When you have the final answer, reply with:",
        "{answer}",
    ),
    "prototype": (  # bfcl-prototype.md's three lines
        "To call a tool, reply with a single JSON object: {call}",
        "For a final answer, reply with: {answer}",
        "Reply with JSON only.",
    ),
    "explicit": (  # says when to call and when not to
        "If one of these tools can do what the user asks, call it: never compute or guess "
        "its result yourself.",
        "To call a tool, reply with a single JSON object: {call}",
        "If no tool fits, or once you have the tool's result, reply with: {answer}",
        "Reply with JSON only.",
    ),
}
SPACED, COMPACT = (", ", ": "), (",", ":")
SPACINGS = {"spaced": (SPACED, SPACED), "compact": (COMPACT, COMPACT),
            "mixed": (SPACED, COMPACT)}  # (the examples' separators, the grammar's)
ORDERS = ("main", "prompt", "declared")
VARIANTS = [f"{w}-{s}" + ("" if o == "main" else f"-{o}-order")
            for w in WORDINGS for s in SPACINGS for o in ORDERS]


def parse(name: str) -> tuple[str, tuple, tuple, str]:
    """``WORDING-SPACING[-ORDER-order]`` (``main``: shipped-mixed, main's own) as (wording,
    the examples' separators, the grammar's separators, argument order)."""
    if name == "main":
        name = "shipped-mixed"
    wording, spacing, *rest = name.split("-")
    order = rest[0] if rest else "main"
    return (wording, *SPACINGS[spacing], order)


_REQUIRED_FIRST = Tool.argument_order


def apply(name: str) -> None:
    """Set the library's choices to variant ``name``."""
    wording, shown, forced, order = parse(name)

    def instructions() -> list[str]:
        dumps = lambda obj: json.dumps(obj, separators=shown)  # noqa: E731
        call = dumps({"tool": "<name>", "arguments": "{...}"}).replace('"{...}"', "{...}")
        answer = dumps({"answer": "<your answer>"})
        return [line.format(call=call, answer=answer) for line in WORDINGS[wording]]

    json_format.instructions = instructions
    grammar.SEPARATORS["json"] = forced
    Tool.argument_order = (lambda t: list(t.properties)) if order == "declared" \
        else _REQUIRED_FIRST
    grammar._written_order = (lambda t, protocol: list(t.properties)) if order == "main" \
        else (lambda t, protocol: t.argument_order())
    grammar._json_grammar.cache_clear()


def synthetic(lm, path: Path, limit: int, max_steps: int) -> dict:
    """Success by task kind (the id's last part), and how many runs ended in an answer."""
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()][:limit]
    subset = path.with_name(f".variants-{os.getpid()}-{path.name}")  # beside it: tools resolve
    subset.write_text("\n".join(lines) + "\n")
    try:
        summary = evaluate.run(lm, subset, protocol="json",
                               config_overrides={"max_steps": max_steps})
    finally:
        subset.unlink()
    kinds, wins = Counter(), Counter()
    for r in summary.runs:
        kind = r.task.rsplit("-", 1)[-1]
        kinds[kind] += 1
        wins[kind] += r.reward
    runs = summary.runs
    return {"n": len(runs), "success": sum(r.reward for r in runs) / len(runs),
            "answered": sum(r.answer is not None for r in runs) / len(runs),
            "by_kind": {k: f"{wins[k]:.0f}/{kinds[k]}" for k in sorted(kinds)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="main,shipped-spaced,prototype-spaced")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tasks", nargs="*", default=[], help="eval task files (held-out)")
    ap.add_argument("--task-limit", type=int, default=20)
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--categories", default="simple,multiple,irrelevance,live_simple")
    ap.add_argument("--bfcl-limit", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS and v != "main"]
    if unknown:
        ap.error(f"unknown variant {unknown[0]!r}; choose main or from {', '.join(VARIANTS)}")
    lm = load(args.model)
    rows = []
    for name in names:
        apply(name)
        wording, shown, forced, order = parse(name)
        row = {"variant": name, "wording": wording, "shown": shown, "forced": forced,
               "order": order}
        for t in args.tasks:
            row[f"synth:{Path(t).parent.name}"] = synthetic(lm, Path(t), args.task_limit,
                                                            args.max_steps)
        service = ChatService(lm, protocol="json", kv_slots=0)
        for c in filter(None, args.categories.split(",")):
            row[f"bfcl:{c}"] = bfcl.run_category(service, c, limit=args.bfcl_limit).accuracy
        rows.append(row)
        write_jsonl(args.out, rows)
        print(table_row(row), flush=True)


def table_row(row: dict) -> str:
    synth = [f"{k[6:]} {v['success']:.0%} (answered {v['answered']:.0%}, {v['by_kind']})"
             for k, v in row.items() if k.startswith("synth:")]
    bf = [f"{k[5:]} {v:.0%}" for k, v in row.items() if k.startswith("bfcl:")]
    return f"{row['variant']}: " + "; ".join(synth + bf)


if __name__ == "__main__":
    main()
