"""Float32 matmul speed in MLX with each BLAS this machine offers, one subprocess each.

    .venv/bin/python scripts/bench_blas.py [--size 1024]

A BLAS must be loaded before ``mlx.core`` is imported, so each candidate runs in a fresh
process: the bundled (netlib) BLAS, Intel MKL from this environment, and Debian's OpenBLAS
with its auto-detected kernel and with ``OPENBLAS_CORETYPE`` forced. Prints GFLOP/s.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys

CHILD = """
import ctypes, sys, time
if sys.argv[1]:
    ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
import mlx.core as mx
n = int(sys.argv[2])
a, b = mx.random.normal((n, n)), mx.random.normal((n, n))
mx.eval(a, b, a @ b)
t = time.perf_counter()
for _ in range(10):
    mx.eval(a @ b)
print(2 * n**3 * 10 / (time.perf_counter() - t) / 1e9)
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args()
    openblas = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
    mkl = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))
    runs = [("bundled", "", {})]
    if mkl:
        runs.append(("Intel MKL (PyPI)", mkl[0], {}))
    if os.path.exists(openblas):
        runs += [("OpenBLAS, auto-detected core", openblas, {"OPENBLAS_CORETYPE": ""}),
                 ("OpenBLAS, OPENBLAS_CORETYPE=Haswell", openblas, {"OPENBLAS_CORETYPE": "Haswell"}),
                 ("OpenBLAS, OPENBLAS_CORETYPE=SkylakeX", openblas, {"OPENBLAS_CORETYPE": "SkylakeX"})]
    print(f"{args.size}x{args.size} float32 matmul in MLX")
    for name, lib, extra in runs:
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
        env.update({k: v for k, v in extra.items() if v})
        out = subprocess.run([sys.executable, "-c", CHILD, lib, str(args.size)], env=env,
                             capture_output=True, text=True, check=True)
        print(f"{name:<40} {float(out.stdout):8.1f} GFLOP/s")


if __name__ == "__main__":
    main()
