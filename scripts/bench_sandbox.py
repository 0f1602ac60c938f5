"""The sandbox's start cost per tool call: `true` through ``run_tool``, unconfined and sandboxed.

    .venv/bin/python scripts/bench_sandbox.py [--runs 200] [--sandbox auto]

Each call is the whole executor path a model's call takes (the bash script, the process
group, the output readers); the figures are the median and mean wall time per call of
``--runs`` calls each way, interleaved so that machine load hits both alike, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from mlx_agent.tools import Tool, resolve_sandbox, run_tool

TRUE = Tool(name="true", description="Do nothing.", parameters={"type": "object"},
            exec_template="true")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--sandbox", default="auto", choices=["auto", "bwrap", "seatbelt"])
    args = ap.parse_args()
    box = resolve_sandbox(args.sandbox, warn=print)
    times: dict[str, list[float]] = {"none": [], box.backend: []}
    with tempfile.TemporaryDirectory() as root:
        for _ in range(args.runs):
            for name, sandbox in (("none", None), (box.backend, box)):
                start = time.perf_counter()
                r = run_tool(TRUE, {}, cwd=root, sandbox=sandbox)
                times[name].append(time.perf_counter() - start)
                assert r.exit_code == 0, r
    for name, t in times.items():
        print(f"{name:>8}: median {statistics.median(t) * 1e3:6.2f} ms, "
              f"mean {statistics.mean(t) * 1e3:6.2f} ms per call ({args.runs} calls)")
    if box.backend != "none":
        ratio = statistics.median(times[box.backend]) / statistics.median(times["none"])
        extra = statistics.median(times[box.backend]) - statistics.median(times["none"])
        print(f"{box.backend} costs {extra * 1e3:.2f} ms more per call ({ratio:.1f}x, medians)")


if __name__ == "__main__":
    main()
