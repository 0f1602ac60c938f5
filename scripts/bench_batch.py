"""Aggregate decode speed at batch sizes 1-16: our BatchDecoder against mlx-lm's BatchGenerator.

    python scripts/bench_batch.py                      # the bundled model, sizes 1 2 4 8 16
    python scripts/bench_batch.py --sizes 1 8 --tokens 32 --repeats 3

Both decode the same distinct prompts greedily on the same loaded model (our CPU kernels in
both), with no stop tokens, for ``--tokens`` steps. Both are timed the same way: wall time
from the first token (prefill excluded) to the last (mlx-lm's own ``generation_tps``
would count only the time inside its steps). Sizes alternate between the two in one process,
best of ``--repeats``, so machine load hits both alike. Prints a table with
aggregate tok/s, our speed-up over our own batch 1, and the ratio to mlx-lm.
"""

from __future__ import annotations

import argparse
import os
import time

import mlx_agent  # noqa: F401  (the fast BLAS before mlx)
import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from mlx_agent.batch import BatchDecoder, Row
from mlx_agent.models import load
from mlx_agent.progress import Progress

TOPICS = ["the sea", "a library", "trains", "winter", "bread", "a river", "chess", "the moon",
          "bees", "a city at night", "rain", "mountains", "a market", "clocks", "the desert",
          "music"]


def prompts(lm, n: int) -> list[list[int]]:
    return [lm.prompt_ids(lm.chat.render([{"role": "user", "content":
                                           f"Write a long story about {TOPICS[i % 16]}."}]))
            for i in range(n)]


def ours(lm, batch: list[list[int]], tokens: int) -> float:
    engines = [lm.engine() for _ in batch]
    for e, p in zip(engines, batch):
        e.sync(p)
    decoder = BatchDecoder(lm.model)
    decoder.join([Row(e, max_tokens=tokens) for e in engines])
    decoder.step()  # the first step also evaluates the merged cache: not decode speed
    mx.eval(decoder.rows[0].logits)
    start = time.perf_counter()
    steps = 0
    while len(decoder):
        decoder.step()
        steps += 1
    return len(batch) * steps / (time.perf_counter() - start)


def theirs(lm, batch: list[list[int]], tokens: int) -> float:
    gen = BatchGenerator(lm.model, stop_tokens=None, completion_batch_size=len(batch),
                         prefill_batch_size=len(batch))
    gen.insert(batch, [tokens] * len(batch))
    start, done = None, 0
    while responses := gen.next_generated():
        if start is None:  # prefill and the first token, as ours excludes them
            start = time.perf_counter()
        else:
            done += len(responses)
    seconds = time.perf_counter() - start
    gen.close()
    return done / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    lm = load(args.model)
    print(f"model {lm.identity.name}; {args.tokens} tokens a row; best of {args.repeats}; "
          f"load average {os.getloadavg()[0]:.2f}")
    best: dict[tuple[str, int], float] = {}
    with Progress(len(args.sizes) * args.repeats * 2, "bench", unit="run") as bar:
        for _ in range(args.repeats):
            for size in args.sizes:
                batch = prompts(lm, size)
                for name, fn in (("ours", ours), ("mlx-lm", theirs)):
                    tps = fn(lm, batch, args.tokens)
                    best[name, size] = max(best.get((name, size), 0.0), tps)
                    bar.advance(f"{name} batch {size}: {tps:.1f} tok/s")
    print(f"load average after {os.getloadavg()[0]:.2f}")
    print(f"{'batch':>5} {'ours tok/s':>11} {'mlx-lm tok/s':>13} {'vs batch 1':>11} "
          f"{'ours/mlx-lm':>12}")
    base = best.get(("ours", args.sizes[0]), 0.0)
    for size in args.sizes:
        o, t = best["ours", size], best["mlx-lm", size]
        print(f"{size:>5} {o:>11.1f} {t:>13.1f} {o / base if base else 0:>10.2f}x "
              f"{o / t if t else 0:>11.2f}x")


if __name__ == "__main__":
    main()
