"""Decode per CPU-second with the fused decode layers against the same layers a node at a time.

    .venv/bin/python scripts/bench_fused_decode.py [--adapter DIR] [--tokens 200] [--rounds 2]

Loads the bundled model (with ``--adapter``, e.g. the default general adapter, whose LoRA
layers the first fused node applies), prefills a short prompt, and decodes ``--tokens``
greedy tokens twice a round: through ``KernelLlamaBlock`` (two fused kernel nodes a layer)
and through mlx-lm's ``TransformerBlock.__call__`` on the same kernel layers (about
twenty-four nodes a layer). Prints tokens per CPU-second of each, their ratio, and whether
the tokens are the same. One kernel thread, so the figure is work, not parallelism.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("MLX_AGENT_KERNEL_THREADS", "1")  # before the kernels load

import mlx_agent  # noqa: E402,F401  (fast BLAS before mlx)
from mlx_agent.models import cpu_layers, load  # noqa: E402


def decode(lm, ids, tokens):
    engine = lm.engine(context_length=len(ids) + tokens + 8)
    engine.prefill(ids)
    start = time.process_time()
    out = list(engine.generate(max_tokens=tokens))
    return out, len(out) / (time.process_time() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--adapter")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    lm = load(args.model, adapter=args.adapter)
    ids = lm.encode("Write a long story about a robot who learns to paint.")
    fused = cpu_layers.KernelLlamaBlock.__call__
    unfused = cpu_layers.llama.TransformerBlock.__call__
    for _ in range(args.rounds):
        cpu_layers.KernelLlamaBlock.__call__ = fused
        a, rate_a = decode(lm, ids, args.tokens)
        cpu_layers.KernelLlamaBlock.__call__ = unfused
        b, rate_b = decode(lm, ids, args.tokens)
        same = sum(x == y for x, y in zip(a, b))
        print(f"fused {rate_a:.1f} vs layer by layer {rate_b:.1f} tok/CPU-s "
              f"({rate_a / rate_b:.2f}x); same tokens {same}/{len(a)}", flush=True)
    cpu_layers.KernelLlamaBlock.__call__ = fused


if __name__ == "__main__":
    main()
