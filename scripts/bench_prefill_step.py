"""Prefill speed by chunk size (the engine's ``prefill_step``) on the bundled model.

    .venv/bin/python scripts/bench_prefill_step.py [--steps 128,256,512] [--prompts 512,2048]
        [--weights auto|float32] [--repeats 2]

For each prompt length and chunk size: tok/s of ``engine.prefill``, best of ``--repeats``
after a warm-up. On the CPU kernels each chunk dequantizes every layer's weights once, so
the chunk size trades that against attention and activation memory; this is the
measurement behind ``mlx_agent.engine.PREFILL_STEP``.
"""

from __future__ import annotations

import argparse
import time

import mlx_agent  # noqa: F401  (fast BLAS before mlx)
from bench_generate import prompt_ids
from mlx_agent.models import load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--weights", default="auto")
    ap.add_argument("--steps", default="128,256,512")
    ap.add_argument("--prompts", default="512,2048")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    lm = load(args.model, weights=args.weights)
    for n in map(int, args.prompts.split(",")):
        ids = prompt_ids(lm, n)
        for step in map(int, args.steps.split(",")):
            best = 0.0
            for r in range(args.repeats + 1):
                engine = lm.engine(context_length=len(ids) + 8, prefill_step=step)
                start = time.perf_counter()
                engine.prefill(ids)
                if r:  # the first warms up
                    best = max(best, len(ids) / (time.perf_counter() - start))
            print(f"prompt {len(ids)} tokens, chunks of {step}: {best:.0f} tok/s", flush=True)


if __name__ == "__main__":
    main()
