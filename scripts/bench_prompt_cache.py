"""Prompt-cache files by storage dtype: bytes, load time and logit drift, against a prefill.

    .venv/bin/python scripts/bench_prompt_cache.py [--tokens 900] [--repeats 5]

Renders the agent's json-protocol system prompt for ``mlx_agent bench prefill``'s synthetic
tools (:func:`mlx_agent.bench.synthetic_tools`), as many as make ``--tokens``, saves it
with each storage dtype (float32, float16, int8) to a fresh directory, then loads it
``--repeats`` times into a new engine (a fresh :class:`PromptCache` each time, so from disk)
and reports the median load, the file's bytes, and the relative logit drift after a short
suffix against a fresh prefill of the same tokens, whose median time is the peer row. The
model's KV cache is float32 (``MLX_AGENT_KV_DTYPE=float32``), as on the pure-MLX path.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("MLX_AGENT_KV_DTYPE", "float32")

import mlx_agent  # noqa: E402,F401  (fast BLAS before mlx)
import numpy as np  # noqa: E402

from mlx_agent.bench import synthetic_tools  # noqa: E402
from mlx_agent.formats import make_format  # noqa: E402
from mlx_agent.models import load  # noqa: E402
from mlx_agent.prompt_cache import STORAGE_DTYPES, PromptCache  # noqa: E402
from mlx_agent.tools import declared_tools  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=900)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    lm = load(args.model)
    fmt, n, ids = make_format("json", lm), 0, []
    while len(ids) < args.tokens:
        n += 1
        ids = fmt.system_prefix(declared_tools(synthetic_tools(n)), False)
    suffix = lm.encode("What is the cheapest flight to Lisbon tomorrow?")
    fresh_times = []
    for _ in range(args.repeats):
        fresh = lm.engine()
        start = time.perf_counter()
        fresh.prefill(ids)
        fresh_times.append(time.perf_counter() - start)
    fresh.sync(ids + suffix)
    want = np.array(fresh.logits)
    print(f"model {args.model}; KV cache {lm.identity.kv_dtype}; {len(ids)} prompt tokens")
    print(f"{'storage':>8} {'MB':>7} {'load ms':>8} {'drift':>9}")
    print(f"{'prefill':>8} {'-':>7} {statistics.median(fresh_times) * 1000:8.0f} {0:9.1e}")
    for storage in STORAGE_DTYPES:
        with tempfile.TemporaryDirectory() as d:
            saved = PromptCache(d, storage=storage).prime(lm.engine(), lm.identity, ids)
            times = []
            for _ in range(args.repeats):
                engine = lm.engine()
                hit = PromptCache(d, storage=storage).prime(engine, lm.identity, ids)
                assert hit.hit
                times.append(hit.seconds)
            engine.sync(ids + suffix)
            got = np.array(engine.logits)
            drift = float(np.abs(got - want).max() / np.abs(want).max())
            print(f"{storage:>8} {saved.bytes / 1e6:7.1f} {statistics.median(times) * 1000:8.0f} "
                  f"{drift:9.1e}")


if __name__ == "__main__":
    main()
