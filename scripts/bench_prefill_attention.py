"""The prefill attention kernel alone against MLX's own, on the bundled model's head shapes.

    .venv/bin/python scripts/bench_prefill_attention.py [--repeats 5]

One layer's causal attention for a 512-query chunk at the end of 512 and of 2,048 keys
(9 query heads, 3 key/value heads of 64, float16 keys and values as the cache keeps them),
timed as ``kernels.prefill_attention`` and as ``mx.fast.scaled_dot_product_attention``
(MLX's CPU fallback), best of ``--repeats``, same process. Prints each one's milliseconds
and GFLOP/s (4 * 64 flops per query-key pair seen) and the speed-up.
"""

from __future__ import annotations

import argparse

from kernel_timing import best_ms, require_extension  # scripts/; first: the fast BLAS before mlx

import mlx.core as mx  # noqa: E402
from mlx_agent.kernels import kernel_status  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    ext = require_extension()
    print(f"kernel: {kernel_status().describe()}")
    print(f"{'queries':>7} {'keys':>5} {'kernel ms':>10} {'GFLOP/s':>8} {'mx.fast ms':>11} "
          f"{'GFLOP/s':>8} {'speed-up':>9}")
    for L, T in ((512, 512), (512, 2048)):
        q = mx.random.normal((1, 9, L, 64), key=mx.random.key(1))
        k, v = mx.random.normal((2, 1, 3, T, 64), key=mx.random.key(2)).astype(mx.float16)
        mx.eval(q, k, v)
        flops = 9 * 4 * 64 * (L * (T - L) + L * (L + 1) / 2)
        ours = best_ms(lambda: ext.prefill_attention(q, k, v, 0.125), args.repeats)
        peer = best_ms(lambda: mx.fast.scaled_dot_product_attention(
            q, k, v, scale=0.125, mask="causal"), args.repeats)
        print(f"{L:>7} {T:>5} {ours:>10.1f} {flops / ours / 1e6:>8.1f} {peer:>11.1f} "
              f"{flops / peer / 1e6:>8.1f} {peer / ours:>8.2f}x")


if __name__ == "__main__":
    main()
