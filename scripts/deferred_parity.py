"""Deferred tools vs full schemas on BFCL, with the spec's ship gate.

    .venv/bin/python scripts/deferred_parity.py [--categories ...] [--limit N] [--out DIR]

Runs ``eval-bfcl``'s scoring in process, once with every schema in the prompt (``full``)
and once with the one-line index plus ``get_tool_info`` (``deferred``), on the same model
and questions, grammar on. The gate (spec 003): the deferred mean accuracy is within +-2
points of the full mean, and deferred averages at most 2 ``get_tool_info`` hops per question.
Writes ``bfcl-full.jsonl``, ``bfcl-deferred.jsonl`` and ``parity.json``; prints both tables
and the verdict. Exit status 0 when the gate passes, 1 when it fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import mlx_agent  # noqa: F401  (fast BLAS before mlx)

ALL = ("simple,multiple,parallel,parallel_multiple,irrelevance,live_simple,live_multiple,"
       "live_parallel,live_parallel_multiple")


def main() -> int:
    from mlx_agent.bfcl import as_row, run_category
    from mlx_agent.cli.bfcl import print_table
    from mlx_agent.fileio import write_jsonl, write_text
    from mlx_agent.models import load
    from mlx_agent.serve import ChatService

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--categories", default=ALL)
    ap.add_argument("--limit", type=int, default=10, help="questions per category")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--out", default="build/parity")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lm = load(args.model)
    names = args.categories.split(",")
    results = {}
    for mode in ("full", "deferred"):
        service = ChatService(lm, tool_mode=mode, kv_slots=0)
        rows = []
        for name in names:
            rows.append(as_row(run_category(service, name, limit=args.limit,
                                            max_tokens=args.max_tokens)))
            write_jsonl(out / f"bfcl-{mode}.jsonl", rows)
            print(f"[{mode}] {name}: {rows[-1]['accuracy']:.1%}", file=sys.stderr, flush=True)
        results[mode] = rows
        print_table(rows)
    mean = {m: sum(r["accuracy"] for r in rows) / len(rows) for m, rows in results.items()}
    n = sum(r["n"] for r in results["deferred"])
    hops = sum(r["mean_hops"] * r["n"] for r in results["deferred"]) / max(n, 1)
    delta = (mean["deferred"] - mean["full"]) * 100
    passed = abs(delta) <= 2.0 and hops <= 2.0
    verdict = {"full_mean": mean["full"], "deferred_mean": mean["deferred"],
               "delta_points": round(delta, 2), "deferred_mean_hops": round(hops, 3),
               "gate": "accept" if passed else "reject",
               "rule": "|deferred - full| <= 2 points and mean hops <= 2"}
    write_text(out / "parity.json", json.dumps(verdict, indent=2) + "\n")
    print(f"\nfull {mean['full']:.1%}, deferred {mean['deferred']:.1%} "
          f"({delta:+.1f} points), {hops:.2f} get_tool_info hops per question: "
          f"{verdict['gate'].upper()}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
