"""What the loop guard costs a token: the grammar's mask alone against the guard's.

    .venv/bin/python scripts/bench_loop_guard.py [--strings 4] [--repeats 5]

A tool with ``--strings`` string parameters has run once; the model now writes a reply that
starts the same call and then changes its last value (the path on which the guard works
hardest: every repeated form stays live until the last value). For each reply token this
times the constraint's mask (the grammar's own, then with the guard refusing the call in
one form, in the forms :func:`mlx_agent.loop_guard.spaced_forms` gives, and in all 2^n
spaced combinations) and prints the mean per token, best of ``--repeats``, and each
guard's cost over the grammar alone. The masks are computed on the CPU while the model
computes the logits, so this is the time the guard can add to a token, not what it adds.
"""

from __future__ import annotations

import argparse
import itertools
import time

import mlx_agent  # noqa: F401  (fast BLAS before mlx)


def main():
    from mlx_agent.grammar import call_text, ll_tokenizer, tool_constraint
    from mlx_agent.loop_guard import LoopGuard, call_bytes, spaced_forms, token_bytes
    from mlx_agent.models import load
    from mlx_agent.tools import Tool

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--strings", type=int, default=4, help="string parameters of the call")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    lm = load(args.model)
    ll = ll_tokenizer(lm)
    names = [f"field_{i}" for i in range(args.strings)]
    tool = Tool(name="book_trip", description="Book a trip.", parameters={
        "type": "object", "properties": {n: {"type": "string"} for n in names},
        "required": names})
    made = {n: f"value number {i}" for i, n in enumerate(names)}
    reply = call_text("json", tool, {**made, names[-1]: "another value"})
    ids = lm.encode(reply)

    def spaced_all(arguments):
        keys = list(arguments)
        return [{k: (" " + v if k in chosen else v) for k, v in arguments.items()}
                for r in range(len(keys) + 1) for chosen in itertools.combinations(keys, r)]

    variants = {"grammar alone": None, "guard, 1 form": [made],
                "guard, spaced_forms": spaced_forms(made), "guard, all forms": spaced_all(made)}
    tokens = token_bytes(ll, lm.vocab_size)
    rows = []
    for label, forms in variants.items():
        best = float("inf")
        for _ in range(args.repeats):
            c = tool_constraint(lm, "json", [tool], 256)
            if forms is not None:
                c = LoopGuard(c, tokens, [call_bytes(lm, ll, call_text("json", tool, f))
                                          for f in forms], ll)
            start = time.perf_counter()
            for t in ids:
                c.mask()
                c.consume(t)
            best = min(best, (time.perf_counter() - start) / len(ids))
        rows.append((label, 0 if forms is None else len(forms), best * 1e6))
    base = rows[0][2]
    print(f"a call of {args.strings} strings, reply of {len(ids)} tokens; "
          f"us a token (mask + consume), best of {args.repeats}")
    print(f"{'constraint':<22}{'forms':>6}{'us/token':>10}{'over grammar':>14}")
    for label, n, us in rows:
        print(f"{label:<22}{n:>6}{us:>10.0f}{us - base:>14.0f}")


if __name__ == "__main__":
    main()
