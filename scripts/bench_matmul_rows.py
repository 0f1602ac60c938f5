"""The quantized matmul alone at 1-16 rows of x: our kernel on the packed W, our kernel on
MLX's layout, and MLX's own ``mx.quantized_matmul``, on the bundled model's matrix shapes.

    .venv/bin/python scripts/bench_matmul_rows.py [--rows 1 4 8 16] [--bits 4] [--repeats 5]
    .venv/bin/python scripts/bench_matmul_rows.py --cold [--threads 2]

One kernel thread (so the figures are work, not parallelism), random 4-bit weights in the
model's shapes (SmolLM2-135M: q/o 576x576, k/v 192x576, gate/up 1536x576, down 576x1536,
the tied head 49152x576), float16 scales and biases as a GGUF Q4_1 file loads. Prints the
best of ``--repeats`` runs per shape and row count in GFLOP/s (2·M·N·K per call), summed
over one of each shape, with the ratios: packed / MLX's layout (what packing buys) and
packed / ``mx.quantized_matmul`` (the peer). Where the CPU has AVX-512 VNNI, "packed" is the
integer kernel on its 16-row blocks and "MLX's layout" the float kernel (what it replaced on
decode); ``MLX_AGENT_KERNEL_ISA=avx512`` gives the float kernel on both.

``--cold`` multiplies 30 distinct copies of each layer shape (the head left out), all in one
evaluation as a decode step does, so W streams from memory instead of staying in cache from
the call before; ``--threads N`` runs N kernel threads (default: ``MLX_AGENT_KERNEL_THREADS``
as set, else one).
"""

from __future__ import annotations

import argparse
import os
import time


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--bits", type=int, choices=(4, 8), default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads is not None and args.threads < 1:
        ap.error("--threads must be at least 1")
    return args


ARGS = _args()
# Read when the kernels load: --threads, else MLX_AGENT_KERNEL_THREADS as set, else one.
if ARGS.threads is not None:
    os.environ["MLX_AGENT_KERNEL_THREADS"] = str(ARGS.threads)
os.environ.setdefault("MLX_AGENT_KERNEL_THREADS", "1")

import mlx_agent  # noqa: E402,F401  (fast BLAS before mlx)
import mlx.core as mx  # noqa: E402
from mlx_agent.kernels import kernel_status  # noqa: E402
from mlx_agent.kernels.qmatmul import pack, quantized_matmul  # noqa: E402

SHAPES = ((576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576))  # (N, K)
LAYER = ((576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536))
LAYERS = 30  # the bundled model's


def seconds(fn, repeats: int, calls: int) -> float:
    mx.eval(fn())  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            mx.eval(fn())
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def matrices(shapes, bits: int) -> list[tuple]:
    mats = []
    for i, (n, k) in enumerate(shapes):
        w = mx.random.normal((n, k), key=mx.random.key(i)) * 0.1
        q, s, b = mx.quantize(w, group_size=32, bits=bits)
        s, b = s.astype(mx.float16), b.astype(mx.float16)
        p = pack(q, s, b, bits)
        mx.eval(q, s, b, p)
        mats.append((n, k, q, s, b, p))
    return mats


def variant(i: int, x, mat, bits: int) -> mx.array:
    """Matmul ``i`` of one matrix: 0 packed, 1 MLX's layout, 2 mx.quantized_matmul."""
    n, k, q, s, b, p = mat
    if i == 2:
        return mx.quantized_matmul(x[k], q, s, b, transpose=True, group_size=32, bits=bits)
    return quantized_matmul(x[k], q, s, b, bits, packed=p if i == 0 else None)


def main() -> None:
    args = ARGS
    status = kernel_status()
    if not status.available:
        raise SystemExit(f"the CPU kernels are not in use here: {status.reason}")
    mats = matrices(LAYER * LAYERS if args.cold else SHAPES, args.bits)
    threads = os.environ["MLX_AGENT_KERNEL_THREADS"]
    what = (f"{LAYERS} layers' distinct matrices in one evaluation" if args.cold
            else "one of each shape")
    print(f"kernel ISA {status.isa}, {threads} thread(s), {args.bits}-bit, best of "
          f"{args.repeats}; GFLOP/s over {what}")
    print(f"{'rows':>4}  {'packed':>8}  {'MLX layout':>10}  {'mx.qmm':>8}  "
          f"{'packed/layout':>13}  {'packed/mx':>9}")
    for m in args.rows:
        x = {k: mx.random.normal((m, k), key=mx.random.key(m)) for k in (576, 1536)}
        mx.eval(x)
        flops = sum(2 * m * n * k for n, k, *_ in mats)
        if args.cold:  # every matrix once per evaluation, in the order of a layer's
            totals = [seconds(lambda i=i: [variant(i, x, mat, args.bits) for mat in mats],
                              args.repeats, 1) for i in range(3)]
        else:
            totals = [0.0, 0.0, 0.0]
            for mat in mats:
                calls = max(2, int(2e8 / (m * mat[0] * mat[1])))
                for i in range(3):
                    totals[i] += seconds(lambda i=i, mat=mat: variant(i, x, mat, args.bits),
                                         args.repeats, calls)
        rates = [flops / t / 1e9 for t in totals]
        print(f"{m:>4}  {rates[0]:>8.1f}  {rates[1]:>10.1f}  {rates[2]:>8.1f}  "
              f"{rates[0] / rates[1]:>12.2f}x  {rates[0] / rates[2]:>8.2f}x")


if __name__ == "__main__":
    main()
