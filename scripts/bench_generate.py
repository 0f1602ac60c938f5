"""Prefill and decode speed: mlx_agent vs mlx-lm (and llama.cpp) on the same model, one run.

    .venv/bin/python scripts/bench_generate.py [--model smollm2-135m] [--prompt-tokens 512]
        [--new-tokens 128] [--long-prompt-tokens 2048] [--repeats 2] [--skip-slow]

Measures, on the bundled model by default:
1. mlx_agent's engine (prefill of a 512-token prompt, then 128 greedy tokens);
2. ``mlx_lm.generate.stream_generate`` on the very same loaded model and prompt ids, with
   the ratio ours / mlx-lm;
3. mlx_agent without the fast CPU path (bundled BLAS, quantized weights), in a subprocess,
   because a BLAS cannot be unloaded from a process (skip with --skip-slow);
4. llama.cpp through ``llama-cpp-python`` on the same GGUF file, when installed, in a
   process of its own (see :func:`bench_llama_cpp`);
5. prefill of a ``--long-prompt-tokens`` prompt (2,048; 0 skips it), ours and llama.cpp's,
   and its ratio to prefill at ``--prompt-tokens`` (long prompts cost more per token:
   attention grows with the context).
Each figure is the best of ``--repeats`` runs after one warm-up.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

import mlx_agent  # noqa: F401  (fast BLAS before mlx)

import mlx.core as mx


def prompt_ids(lm, n: int) -> list[int]:
    text = ("The agent reads the tool catalogue, picks a tool, checks its arguments against "
            "the schema, runs it, and reads the result before it answers. ")
    ids = lm.encode(text * (n // 20 + 2))
    return ids[:n]


def bench_ours(lm, ids, new_tokens, repeats):
    best_p = best_d = 0.0
    for r in range(repeats + 1):
        engine = lm.engine(context_length=len(ids) + new_tokens + 8)
        t0 = time.perf_counter()
        engine.prefill(ids)
        t1 = time.perf_counter()
        n = sum(1 for _ in engine.generate(max_tokens=new_tokens)) if new_tokens else 0
        t2 = time.perf_counter()
        if r:  # the first run warms up
            best_p = max(best_p, len(ids) / (t1 - t0))
            best_d = max(best_d, n / (t2 - t1))
    return best_p, best_d


def bench_mlx_lm(lm, ids, new_tokens, repeats):
    from mlx_lm.generate import stream_generate

    best_p = best_d = 0.0
    for r in range(repeats + 1):
        last = None
        for last in stream_generate(lm.model, lm.tokenizer, mx.array(ids),
                                    max_tokens=new_tokens):
            pass
        if r:
            best_p = max(best_p, last.prompt_tps)
            best_d = max(best_d, last.generation_tps)
    return best_p, best_d


def bench_llama_cpp(path, ids, new_tokens, repeats):
    """llama.cpp's (prefill, decode) in a process of its own, or None where it is not
    installed. Not in this one: here MKL's OpenMP runtime is loaded (our BLAS), and
    llama.cpp's OpenMP calls would run on it, with our ``KMP_BLOCKTIME`` of 0, so its threads
    would sleep between the hundreds of parallel regions of a token (measured: 22 tok/s
    in-process against 98 alone, 2 threads)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    env = {**os.environ, "MLX_AGENT_BLAS": "none"}
    out = subprocess.run(
        [sys.executable, __file__, "--llama-cpp", str(path), "--new-tokens", str(new_tokens),
         "--repeats", str(repeats)], input=json.dumps(ids), env=env, capture_output=True,
        text=True, check=True)
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


def _llama_cpp_here(path, ids, new_tokens, repeats):
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=len(ids) + new_tokens + 8, n_threads=os.cpu_count(),
                n_batch=512, verbose=False)
    if not new_tokens:
        return _llama_cpp_prefill(llm, ids, repeats), 0.0
    best_p = best_d = 0.0
    for r in range(repeats + 1):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        for _ in range(new_tokens):
            tok = llm.sample(temp=0.0)
            llm.eval([tok])
        t2 = time.perf_counter()
        if r:
            best_p = max(best_p, len(ids) / (t1 - t0))
            best_d = max(best_d, new_tokens / (t2 - t1))
    return best_p, best_d


def _llama_cpp_prefill(llm, ids, repeats):
    best = 0.0
    for r in range(repeats + 1):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        if r:
            best = max(best, len(ids) / (time.perf_counter() - t0))
    return best


def long_prompt_rows(lm, args, short_rows):
    """Prefill at ``--long-prompt-tokens``: ours and llama.cpp's, each against its own
    prefill at ``--prompt-tokens``."""
    ids = prompt_ids(lm, args.long_prompt_tokens)
    ours = bench_ours(lm, ids, 0, args.repeats)[0]
    rows = [(f"mlx_agent prefill @{len(ids)}", ours, ours / short_rows["mlx_agent"])]
    cpp = bench_llama_cpp(lm.path, ids, 0, args.repeats) if "llama.cpp" in short_rows else None
    if cpp:
        rows.append((f"llama.cpp prefill @{len(ids)}", cpp[0], cpp[0] / short_rows["llama.cpp"]))
        rows.append((f"ratio mlx_agent / llama.cpp @{len(ids)}", ours / cpp[0], None))
    return rows


def worker(args):
    """Ours only, in this process's configuration; prints JSON."""
    from mlx_agent import blas
    from mlx_agent.models import load

    lm = load(args.model, weights=args.weights)
    ids = prompt_ids(lm, args.prompt_tokens)
    p, d = bench_ours(lm, ids, args.new_tokens, args.repeats)
    print(json.dumps({"prefill": p, "decode": d, "blas": blas.status().name,
                      "weights": lm.identity.weight_format}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--long-prompt-tokens", type=int, default=2048,
                    help="also measure prefill at this length (0: skip)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--skip-slow", action="store_true", help="skip the no-fast-path run")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--weights", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--llama-cpp", help=argparse.SUPPRESS)  # the peer's own process
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.llama_cpp:
        ids = json.loads(sys.stdin.read())
        return print(json.dumps(_llama_cpp_here(args.llama_cpp, ids, args.new_tokens,
                                                args.repeats)))

    from mlx_agent import blas
    from mlx_agent.models import load

    lm = load(args.model)
    ids = prompt_ids(lm, args.prompt_tokens)
    device = "metal" if mx.metal.is_available() else "cpu"
    print(f"model: {lm.path.name}; device: {device}; BLAS: {blas.status().name}; "
          f"weights: {lm.identity.weight_format}; prompt {len(ids)} tokens, "
          f"{args.new_tokens} new tokens; best of {args.repeats}", flush=True)
    rows = [("mlx_agent", *bench_ours(lm, ids, args.new_tokens, args.repeats))]
    rows.append(("mlx-lm stream_generate (same model)",
                 *bench_mlx_lm(lm, ids, args.new_tokens, args.repeats)))
    ratio = ("ratio mlx_agent / mlx-lm", rows[0][1] / rows[1][1], rows[0][2] / rows[1][2])
    if not args.skip_slow and device == "cpu":
        env = {**os.environ, "MLX_AGENT_BLAS": "none", "MLX_AGENT_KERNELS": "0"}
        out = subprocess.run(
            [sys.executable, __file__, "--worker", "--weights", "quantized", "--model", args.model,
             "--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens),
             "--repeats", "1"], env=env, capture_output=True, text=True, check=True)
        slow = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(("mlx_agent without the fast CPU path", slow["prefill"], slow["decode"]))
    cpp = bench_llama_cpp(lm.path, ids, args.new_tokens, args.repeats) \
        if lm.identity.format == "gguf" else None
    if cpp:
        rows.append(("llama.cpp (llama-cpp-python, same GGUF)", *cpp))
    else:
        print("llama.cpp: llama-cpp-python not installed; skipped")
    width = max(len(r[0]) for r in rows + [ratio])
    print(f"{'':{width}}  prefill tok/s  decode tok/s")
    for name, p, d in rows:
        print(f"{name:{width}}  {p:13.1f}  {d:12.1f}")
    print(f"{ratio[0]:{width}}  {ratio[1]:12.2f}x  {ratio[2]:11.2f}x")
    if args.long_prompt_tokens:
        short = {"mlx_agent": rows[0][1]}
        if cpp:
            short["llama.cpp"] = cpp[0]
        long_rows = long_prompt_rows(lm, args, short)
        width = max(len(r[0]) for r in long_rows)
        print(f"\n{'':{width}}  prefill tok/s  vs prefill @{len(ids)}")
        for name, p, vs in long_rows:  # vs is None on the ratio row
            print(f"{name:{width}}  {p:12.2f}x" if vs is None
                  else f"{name:{width}}  {p:13.1f}  {vs:17.2f}x")


if __name__ == "__main__":
    main()
