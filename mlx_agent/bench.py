"""``mlx_agent bench prefill``: what the persistent prompt cache saves, measured in one run.

Each launch is a separate process (so no cache survives in memory), timed from the moment the
model is loaded to the first generated token of a user turn:

- ``none``: no prompt cache, the system prompt is prefilled with the user turn;
- ``cold``: an empty ``--prompt-cache-dir``, so prefill plus save;
- ``warm``: the file the cold launch wrote is loaded instead of prefilled.

That is done for the given tools file and for synthetic catalogues that make system prompts of
about 256, 1k, 2k and 4k tokens. A scripted multi-turn task (tool calls forced through a
scripted sampler on the real model, so the count does not depend on the model's wisdom) gives
the share of rendered tokens served from the cache instead of prefilled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .errors import UserFacingError

SIZES = (256, 1024, 2048, 4096)


def synthetic_tools(n: int) -> list[dict]:
    """``n`` plausible tools, for system prompts of a chosen length."""
    out = []
    for i in range(n):
        out.append({"type": "function", "function": {
            "name": f"service_{i}_lookup",
            "description": f"Look up records in service {i} by id, with optional filters for "
                           f"region and status; returns JSON rows.",
            "parameters": {"type": "object", "properties": {
                "record_id": {"type": "string", "description": "Record id."},
                "region": {"type": "string"}, "status": {"type": "string"},
                "limit": {"type": "integer"}}, "required": ["record_id"]},
            "_exec": 'echo "$record_id"'}})
    return out


def worker(model: str | None, tools_file: str, mode: str, cache_dir: str) -> dict:
    """One launch; returns its timings as a dict (printed as JSON by ``main``)."""
    from .agent import Conversation, agent_format
    from .models import load
    from .prompt_cache import PromptCache
    from .tools import load_tools

    lm = load(model)
    tools = load_tools(tools_file, handlers="list")  # its prompt is all the benchmark reads
    conversation = Conversation(agent_format("json", lm), tools)
    engine = lm.engine()
    start = time.perf_counter()
    out = {"mode": mode, "system_tokens": len(conversation.system_ids)}
    if mode != "none":
        hit = PromptCache(cache_dir).prime(engine, lm.identity, conversation.system_ids)
        out["cache_ms" if hit.hit else "prefill_save_ms"] = hit.seconds * 1000
        out["bytes"] = hit.bytes
        out["hit"] = hit.hit
    conversation.add_user("What can you do?")
    engine.sync(conversation.prompt_ids())
    next(engine.generate(max_tokens=1))
    out["ttft_ms"] = (time.perf_counter() - start) * 1000
    return out


def multi_turn_share(model: str | None, cache_dir: str, rounds: int = 4) -> dict:
    """Reuse over a scripted task with ``rounds`` tool calls on the real model, launched with
    a warm prompt cache (the system prompt loaded, as on every launch after the first)."""
    import mlx.core as mx

    from .agent import Agent, AgentConfig, agent_format
    from .models import load
    from .prompt_cache import PromptCache
    from .tools import parse_tools

    lm = load(model)
    tools = parse_tools(json.dumps(synthetic_tools(5)))
    fmt = agent_format("json", lm)
    script: list[int] = []
    for i in range(rounds):
        script += lm.encode(json.dumps({"tool": f"service_{i}_lookup",
                                        "arguments": {"record_id": f"r{i}"}}))
    script += lm.encode(json.dumps({"answer": "done"}))

    def sampler(_):
        return mx.array([script.pop(0)])

    # no grammar: the script forces every token (the grammar would refuse json.dumps' spacing)
    agent = Agent(lm, lm.engine(), tools, fmt, AgentConfig(max_steps=rounds + 1, grammar=False),
                  sampler=sampler)
    system_ids = agent.conversation.system_ids
    PromptCache(cache_dir).prime(lm.engine(), lm.identity, system_ids)  # the cold launch
    agent.prime(PromptCache(cache_dir))  # this launch: warm
    stats = agent.ask("Check the five services for record r0.").stats
    if stats.calls != rounds or stats.stop != "answer":
        raise RuntimeError(f"the scripted task ran {stats.calls} of {rounds} tool rounds "
                           f"(stopped: {stats.stop})")
    return {"turns": stats.turns, "calls": stats.calls, "rendered": stats.rendered_tokens,
            "reused": stats.reused_tokens, "prefilled": stats.prefilled_tokens,
            "share": stats.reused_tokens / stats.rendered_tokens}


_USER_ERROR = "mlx_agent: error: "  # a worker's user error, its one line on stderr


class WorkerError(RuntimeError):
    """A launch that failed for a reason of ours; the message is its last line on stderr."""


def _launch(model, tools_file, mode, cache_dir) -> dict:
    """One launch in its own process, started in a neutral folder (``cache_dir``'s parent)
    with this package first on its path, so that a folder holding an ``mlx_agent/`` of its
    own shadows nothing; the paths it is given are absolute."""
    import mlx_agent

    cmd = [sys.executable, "-m", "mlx_agent.bench", "worker", tools_file, mode, cache_dir]
    if model:
        cmd.append(model)
    root = str(Path(mlx_agent.__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(cache_dir).parent,
                         env={**os.environ, "PYTHONPATH": path})
    if out.returncode != 0:
        lines = [line.strip() for line in out.stderr.splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit status {out.returncode}"
        if out.returncode == 2 and last.startswith(_USER_ERROR):
            raise UserFacingError(f"the {mode} launch failed: {last[len(_USER_ERROR):]}")
        raise WorkerError(f"the {mode} launch failed: {last}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def check(model: str | None, tools_file: str | None, plot: str | None) -> str | None:
    """Bad input found before the benchmark starts: the model spec, the tools file, and
    matplotlib for ``plot``. Returns the model spec for the launches (a named model's name,
    else its absolute path)."""
    from .models.registry import NAMED_MODELS, resolve
    from .tools import load_tools

    if plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UserFacingError("--plot needs matplotlib, which is not installed "
                                  "(pip install 'mlx-agent[plot]')") from None
    path = resolve(model)
    if tools_file:
        load_tools(tools_file, handlers="list")  # a bad file fails before the workers start
    return model if model is None or model in NAMED_MODELS else str(path.resolve())


def run(model: str | None, tools_file: str | None, echo=print, plot: str | None = None) -> list:
    model = check(model, tools_file, plot)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        if tools_file:
            files.append(("your tools", str(Path(tools_file).resolve())))
        for size in SIZES:
            path = Path(tmp) / f"tools-{size}.json"
            # about 62 tokens a tool line plus ~70 of instructions (measured on SmolLM2)
            path.write_text(json.dumps(synthetic_tools(max(1, (size - 70) // 62))))
            files.append((f"~{size}", str(path)))
        echo(f"{'system prompt':<14} {'tokens':>6} {'no cache':>10} {'cold':>10} {'warm':>10}"
             f" {'prefill+save':>12} {'load':>8} {'bytes':>11} {'warm/cold':>9}")
        for label, path in files:
            cache_dir = Path(tmp) / f"kv-{len(rows)}"
            none = _launch(model, path, "none", str(cache_dir))
            cold = _launch(model, path, "cold", str(cache_dir))
            warm = _launch(model, path, "warm", str(cache_dir))
            if not warm.get("hit"):
                raise RuntimeError("the warm launch missed the cache the cold one wrote")
            row = {"label": label, "tokens": none["system_tokens"], "none_ms": none["ttft_ms"],
                   "cold_ms": cold["ttft_ms"], "warm_ms": warm["ttft_ms"],
                   "prefill_save_ms": cold["prefill_save_ms"], "load_ms": warm["cache_ms"],
                   "bytes": warm["bytes"]}
            rows.append(row)
            echo(f"{label:<14} {row['tokens']:>6} {row['none_ms']:>8.0f}ms {row['cold_ms']:>8.0f}ms"
                 f" {row['warm_ms']:>8.0f}ms {row['prefill_save_ms']:>10.0f}ms"
                 f" {row['load_ms']:>6.0f}ms {row['bytes']:>11} {row['warm_ms'] / row['cold_ms']:>9.3f}")
        share = multi_turn_share(model, str(Path(tmp) / "kv-task"))
    echo(f"scripted task, warm launch, {share['turns']} assistant steps "
         f"({share['calls']} tool rounds): "
         f"{share['reused']} of {share['rendered']} rendered tokens served from the cache "
         f"({share['share']:.1%}), {share['prefilled']} prefilled")
    if plot:
        _plot(rows, plot, echo)
    return rows


def _plot(rows, path, echo) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        echo("matplotlib is not installed; no plot (pip install 'mlx-agent[plot]')")
        return
    synth = [r for r in rows if r["label"].startswith("~")]
    x = [r["tokens"] for r in synth]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, name in (("none_ms", "no cache"), ("cold_ms", "cold cache"), ("warm_ms", "warm cache")):
        ax.plot(x, [r[key] for r in synth], marker="o", label=name)
    ax.set_xlabel("system prompt tokens")
    ax.set_ylabel("time to first token (ms)")
    ax.set_title("mlx_agent prompt cache")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    echo(f"plot written to {path}")


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    _, _, tools_file, mode, cache_dir, *model = sys.argv
    import mlx_agent  # noqa: F401  (BLAS before mlx)

    try:
        result = worker(model[0] if model else None, tools_file, mode, cache_dir)
    except UserFacingError as e:  # one line, which the parent shows
        print(f"{_USER_ERROR}{' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(result))
