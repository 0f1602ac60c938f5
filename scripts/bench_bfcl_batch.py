"""eval-bfcl at --batch 1 against --batch N, in one process: wall time and agreement.

    python scripts/bench_bfcl_batch.py --category simple --limit 50 --batch 8

Answers the same questions one at a time (one ChatService, as `eval-bfcl` does) and N at a
time (a service with N lanes over one BatchRunner), prints each run's wall time and accuracy, the
speed-up, and every question whose calls differ between the two runs.
"""

from __future__ import annotations

import argparse
import os
import time

import mlx_agent  # noqa: F401  (the fast BLAS before mlx)
from mlx_agent.batch_runner import BatchRunner
from mlx_agent.bfcl import category_questions, run_category
from mlx_agent.models import load
from mlx_agent.progress import Progress
from mlx_agent.serve import ChatService


def _score(lm, category, limit, max_tokens, batch):
    rows = {}
    runner = BatchRunner(lm.model, max_batch=batch) if batch > 1 else None
    try:
        main = ChatService(lm, kv_slots=0,
                           engines=[runner.engine(lm) for _ in range(batch)] if runner else ())
        with Progress(len(category_questions(category, limit)), f"batch {batch}", unit="q") as bar:
            def item(r):
                rows[r["id"]] = r
                bar.advance()

            start = time.perf_counter()
            score = run_category(main, category, limit=limit, max_tokens=max_tokens,
                                 at_once=batch, on_item=item)
            seconds = time.perf_counter() - start
    finally:
        if runner:
            runner.close()
    return score, seconds, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--category", default="simple")
    ap.add_argument("--limit", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    lm = load(args.model)
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    one = _score(lm, args.category, args.limit, args.max_tokens, 1)
    many = _score(lm, args.category, args.limit, args.max_tokens, args.batch)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    for batch, (score, seconds, _) in ((1, one), (args.batch, many)):
        print(f"--batch {batch:<2} {score.n} questions  accuracy {score.accuracy:.1%}  "
              f"{seconds:.1f} s")
    print(f"speed-up: {one[1] / many[1]:.2f}x")
    differ = [q for q in one[2] if one[2][q]["calls"] != many[2][q]["calls"]]
    agree = 1 - len(differ) / max(len(one[2]), 1)
    print(f"same calls on {agree:.1%} of questions")
    for q in differ:
        print(f"  {q}: --batch 1 {one[2][q]['calls']}  --batch {args.batch} {many[2][q]['calls']}")


if __name__ == "__main__":
    main()
