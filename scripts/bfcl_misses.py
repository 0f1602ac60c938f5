"""Read a model's BFCL misses: each missed question, the calls made and BFCL's answer, and a
count of misses by kind (no call, wrong function, a stated argument left out, other).

    .venv/bin/python scripts/bfcl_misses.py simple --limit 100 [--adapter DIR] [--out misses.json]

"A stated argument left out" is a call to the right function without a parameter whose every
possible answer is a value (BFCL marks an optional one the question does not state with "").
Without --adapter the model's default adapter is used, as `eval-bfcl` does. Not promised: a
miss's kind is the first that applies, not its only cause.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

from mlx_agent.batch_runner import batch_engines
from mlx_agent.bfcl import CATEGORIES, bfcl, category_questions, run_category
from mlx_agent.errors import UserFacingError
from mlx_agent.fileio import write_text
from mlx_agent.models import load
from mlx_agent.models.registry import default_adapter
from mlx_agent.serve import ChatService


def kind(calls: list[dict], truth: list[dict] | None) -> str:
    if not calls:
        return "no call"
    if not truth:  # an irrelevance question: any call misses
        return "called"
    (name, expected), = truth[0].items()
    if name not in calls[0]:
        return "wrong function"
    if any("" not in values and param not in calls[0][name]
           for param, values in expected.items()):
        return "stated argument left out"
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("category", choices=sorted(CATEGORIES))
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--adapter", default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", default=None, help="JSON file of the misses")
    args = ap.parse_args()
    if args.limit < 1 or args.batch < 1:
        ap.error("--limit and --batch take counts of at least 1")
    if args.out and (Path(args.out).is_dir()
                     or not os.access(Path(args.out).parent, os.W_OK | os.X_OK)):
        ap.error(f"--out {args.out} cannot be written: give a file in a writable directory")
    adapter = args.adapter or default_adapter(args.model)
    try:
        bfcl()
        lm = load(args.model, adapter=str(adapter) if adapter else None)
    except UserFacingError as e:
        sys.exit(f"error: {e}")
    service = ChatService(lm, tool_mode="full", protocol="auto", kv_slots=0,
                          engines=batch_engines(lm, args.batch) if args.batch > 1 else ())
    rows: list[dict] = []
    run_category(service, args.category, limit=args.limit, at_once=args.batch,
                 on_item=rows.append)
    questions = {q["id"]: q for q in category_questions(args.category, args.limit)}
    truth = ({} if "irrelevance" in CATEGORIES[args.category] else
             {a["id"]: a["ground_truth"] for a in bfcl().answers(CATEGORIES[args.category])})
    misses = [{"id": r["id"], "question": questions[r["id"]]["question"][0][-1]["content"],
               "calls": r["calls"], "truth": truth.get(r["id"]),
               "kind": kind(r["calls"], truth.get(r["id"]))}
              for r in sorted(rows, key=lambda r: r["id"]) if not r["ok"]]
    for m in misses:
        print(f"{m['id']} [{m['kind']}] {m['question'][:100]!r} -> {json.dumps(m['calls'])[:200]}")
    by_kind = Counter(m["kind"] for m in misses).most_common()
    print(f"{len(rows) - len(misses)} of {len(rows)} right; misses: "
          + (", ".join(f"{k} {n}" for k, n in by_kind) or "none"))
    if args.out:
        try:  # atomically: an interrupted run leaves no half-written file
            write_text(args.out, json.dumps(misses, indent=1))
        except OSError as e:
            sys.exit(f"error: cannot write {args.out}: {e.strerror or e}")


if __name__ == "__main__":
    main()
