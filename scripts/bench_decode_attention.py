"""The decode attention kernel alone against MLX's own, on the bundled model's head shapes.

    .venv/bin/python scripts/bench_decode_attention.py [--repeats 5]

One decode step's attention over all 30 layers (30 independent calls in one evaluation):
one query position, 9 query heads, 3 key/value heads of 64, float16 keys and values as the
cache keeps them (a slice of a longer buffer, as the cache hands them over): batch 1 at 512,
2,048 and 4,096 keys, batch 8 at 512 and 2,048 (with its rows' padding mask: every row sees
all keys). Timed as ``kernels.decode_attention`` and as
``mx.fast.scaled_dot_product_attention`` (MLX's CPU path), best of ``--repeats``, same
process. Prints milliseconds per step, the key/value bytes read per second, and the
speed-up.
"""

from __future__ import annotations

import argparse

from kernel_timing import best_ms, require_extension  # scripts/; first: the fast BLAS before mlx

import mlx.core as mx  # noqa: E402
from mlx_agent.kernels import kernel_status  # noqa: E402

LAYERS = 30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    ext = require_extension()
    print(f"kernel: {kernel_status().describe()}; {LAYERS} layers a step")
    print(f"{'batch':>5} {'keys':>5} {'kernel ms':>10} {'GB/s':>6} {'mx.fast ms':>11} "
          f"{'GB/s':>6} {'speed-up':>9}")
    for B, T in ((1, 512), (1, 2048), (1, 4096), (8, 512), (8, 2048)):
        q = [mx.random.normal((B, 9, 1, 64), key=mx.random.key(i)) for i in range(LAYERS)]
        # each layer's keys and values: a slice of a preallocated cache buffer, read in place
        kv = [[mx.random.normal((B, 3, T + 256, 64), key=mx.random.key(100 * j + i))
               .astype(mx.float16)[..., :T, :] for j in (1, 2)] for i in range(LAYERS)]
        starts = mx.zeros((B,), dtype=mx.int32) if B > 1 else None
        mask = mx.zeros((B, 1, 1, T), dtype=mx.bool_) == 0 if B > 1 else None
        mx.eval(q, kv, starts, mask)
        gb = LAYERS * 2 * B * 3 * T * 64 * 2 / 1e9
        ours = best_ms(lambda: [ext.decode_attention(q[i], kv[i][0], kv[i][1], 0.125, starts)
                                for i in range(LAYERS)], args.repeats)
        peer = best_ms(lambda: [mx.fast.scaled_dot_product_attention(
            q[i], kv[i][0], kv[i][1], scale=0.125, mask=mask) for i in range(LAYERS)],
            args.repeats)
        print(f"{B:>5} {T:>5} {ours:>10.2f} {gb / ours * 1e3:>6.1f} {peer:>11.2f} "
              f"{gb / peer * 1e3:>6.1f} {peer / ours:>8.2f}x", flush=True)


if __name__ == "__main__":
    main()
