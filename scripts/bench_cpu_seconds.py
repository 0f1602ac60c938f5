"""Prefill and decode per CPU-second, mlx_agent against llama.cpp, one thread each.

    .venv/bin/python scripts/bench_cpu_seconds.py [--prompt-tokens 512] [--new-tokens 64]
        [--repeats 2]

Wall-clock figures on a machine shared with other jobs vary by a factor of two from run to
run; the CPU time a process spends on a token varies far less. With one thread each (our
kernels' pool and llama.cpp's), nobody spins waiting for a descheduled thread, so tokens per
CPU-second measure the work each does. Not a wall-clock speed: on an idle machine both use
their threads in parallel. Needs llama-cpp-python.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("MLX_AGENT_KERNEL_THREADS", "1")  # before the kernels load

import mlx_agent  # noqa: E402,F401  (fast BLAS before mlx)

from bench_generate import prompt_ids  # noqa: E402
from mlx_agent.models import load  # noqa: E402


def ours(lm, ids, new_tokens):
    engine = lm.engine(context_length=len(ids) + new_tokens + 8)
    c0 = time.process_time()
    engine.prefill(ids)
    c1 = time.process_time()
    n = sum(1 for _ in engine.generate(max_tokens=new_tokens))
    return len(ids) / (c1 - c0), n / (time.process_time() - c1)


def llama_cpp(llm, ids, new_tokens):
    llm.reset()
    c0 = time.process_time()
    llm.eval(ids)
    c1 = time.process_time()
    for _ in range(new_tokens):
        llm.eval([llm.sample(temp=0.0)])
    return len(ids) / (c1 - c0), new_tokens / (time.process_time() - c1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    try:
        from llama_cpp import Llama
    except ImportError:  # an optional peer (the bench extra), not installed by make install
        sys.exit("bench_cpu_seconds.py needs llama-cpp-python: pip install -e '.[bench]' "
                 "(see the README's Benchmark section for its build flags)")
    lm = load("smollm2-135m")
    ids = prompt_ids(lm, args.prompt_tokens)
    llm = Llama(model_path=str(lm.path), n_ctx=len(ids) + args.new_tokens + 8, n_threads=1,
                n_batch=512, verbose=False)
    ours(lm, ids, args.new_tokens), llama_cpp(llm, ids, args.new_tokens)  # warm-ups
    print(f"{len(ids)}-token prompt, {args.new_tokens} new tokens, 1 thread each, "
          f"load average {os.getloadavg()[0]:.1f}")
    for _ in range(args.repeats):
        (p, d), (cp, cd) = ours(lm, ids, args.new_tokens), llama_cpp(llm, ids, args.new_tokens)
        print(f"per CPU-second: prefill {p:.0f} vs llama.cpp {cp:.0f} ({p / cp:.2f}x); "
              f"decode {d:.1f} vs {cd:.1f} ({d / cd:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
