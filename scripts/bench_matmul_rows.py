"""The quantized matmul alone at 1-16 rows of x: our kernel on the packed W, our kernel on
MLX's layout, and MLX's own ``mx.quantized_matmul``, on the bundled model's matrix shapes.

    .venv/bin/python scripts/bench_matmul_rows.py [--rows 1 4 8 16] [--bits 4] [--repeats 5]

One kernel thread (so the figures are work, not parallelism), random 4-bit weights in the
model's shapes (SmolLM2-135M: q/o 576x576, k/v 192x576, gate/up 1536x576, down 576x1536,
the tied head 49152x576), float16 scales and biases as a GGUF Q4_1 file loads. Prints the
best of ``--repeats`` runs per shape and row count in GFLOP/s (2·M·N·K per call), summed
over one of each shape, with the ratios: packed / MLX's layout (what packing buys) and
packed / ``mx.quantized_matmul`` (the peer). Where the CPU has AVX-512 VNNI, "packed" is the
integer kernel on its 16-row blocks and "MLX's layout" the float kernel (what it replaced on
decode); ``MLX_AGENT_KERNEL_ISA=avx512`` gives the float kernel on both.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("MLX_AGENT_KERNEL_THREADS", "1")  # before the kernels load

import mlx_agent  # noqa: E402,F401  (fast BLAS before mlx)
import mlx.core as mx  # noqa: E402
from mlx_agent.kernels import kernel_status  # noqa: E402
from mlx_agent.kernels.qmatmul import pack, quantized_matmul  # noqa: E402

SHAPES = ((576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576))  # (N, K)


def seconds(fn, repeats: int, calls: int) -> float:
    mx.eval(fn())  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            mx.eval(fn())
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--bits", type=int, choices=(4, 8), default=4)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    status = kernel_status()
    if not status.available:
        raise SystemExit(f"the CPU kernels are not in use here: {status.reason}")
    mats = []
    for n, k in SHAPES:
        w = mx.random.normal((n, k), key=mx.random.key(n + k)) * 0.1
        q, s, b = mx.quantize(w, group_size=32, bits=args.bits)
        s, b = s.astype(mx.float16), b.astype(mx.float16)
        p = pack(q, s, b, args.bits)
        mx.eval(q, s, b, p)
        mats.append((n, k, q, s, b, p))
    print(f"kernel ISA {status.isa}, one thread, {args.bits}-bit, best of {args.repeats}; "
          "GFLOP/s over one of each shape")
    print(f"{'rows':>4}  {'packed':>8}  {'MLX layout':>10}  {'mx.qmm':>8}  "
          f"{'packed/layout':>13}  {'packed/mx':>9}")
    for m in args.rows:
        totals = [0.0, 0.0, 0.0]
        flops = 0
        for n, k, q, s, b, p in mats:
            x = mx.random.normal((m, k), key=mx.random.key(m))
            mx.eval(x)
            calls = max(2, int(2e8 / (m * n * k)))
            runs = (lambda: quantized_matmul(x, q, s, b, args.bits, packed=p),
                    lambda: quantized_matmul(x, q, s, b, args.bits),
                    lambda: mx.quantized_matmul(x, q, s, b, transpose=True, group_size=32,
                                                bits=args.bits))
            for i, fn in enumerate(runs):
                totals[i] += seconds(fn, args.repeats, calls)
            flops += 2 * m * n * k
        rates = [flops / t / 1e9 for t in totals]
        print(f"{m:>4}  {rates[0]:>8.1f}  {rates[1]:>10.1f}  {rates[2]:>8.1f}  "
              f"{rates[0] / rates[1]:>12.2f}x  {rates[0] / rates[2]:>8.2f}x")


if __name__ == "__main__":
    main()
