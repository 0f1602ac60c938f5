"""Decode per CPU-second with the weights packed for decode against MLX's layout alone.

    .venv/bin/python scripts/bench_packed_decode.py [--model smollm2-135m-base] [--tokens 200]
        [--rounds 3]

Loads the model on the CPU kernels (which pack every quantized layer's W by 4-row blocks,
:func:`mlx_agent.kernels.qmatmul.pack`), prefills a short prompt and decodes ``--tokens``
greedy tokens twice a round: reading the packed copies, and with them set aside, so the
kernel reads MLX's three arrays (codes, scales, biases) as it did before packing. Prints
tokens per CPU-second of each, their ratio, and whether the tokens are the same. One
kernel thread, so the figure is work, not parallelism.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("MLX_AGENT_KERNEL_THREADS", "1")  # before the kernels load

import mlx_agent  # noqa: E402,F401  (fast BLAS before mlx)
from bench_fused_decode import decode  # noqa: E402  (per CPU-second, the same way)
from mlx_agent.models import load  # noqa: E402

PROMPT = "Tell me a story about the sea and a boat, with a storm and a lighthouse."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-base")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    lm = load(args.model)
    layers = [m for _, m in lm.model.named_modules() if "_pack" in m.__dict__]
    if not layers:
        raise SystemExit("no packed layers: the CPU kernels are not in use here")
    packs = {id(m): m.__dict__["_pack"] for m in layers}
    ids = lm.encode(PROMPT)
    for r in range(args.rounds):
        for m in layers:
            m.__dict__["_pack"] = packs[id(m)]
        packed, ours = decode(lm, ids, args.tokens)
        for m in layers:
            del m.__dict__["_pack"]
        plain, theirs = decode(lm, ids, args.tokens)
        same = sum(a == b for a, b in zip(packed, plain))
        print(f"round {r + 1}: packed {ours:.1f} vs MLX's layout {theirs:.1f} tok/CPU-s "
              f"({ours / theirs:.2f}x); same tokens {same}/{len(packed)}", flush=True)


if __name__ == "__main__":
    main()
