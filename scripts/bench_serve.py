"""Server latency on growing, interleaved conversations: mlx_agent serve vs mlx-lm's server.

    .venv/bin/python scripts/bench_serve.py [--turns 4] [--max-tokens 24]

Both servers run the bundled model with the same weights (float32 on the CPU, the same
BLAS), in their own processes: ``mlx_agent serve``, and ``mlx_lm.server`` on an MLX export
of the very same weights (written to ``build/bench_serve/model``). Two clients each hold a
conversation with a ~700-token system prompt; they take turns, and each request sends the
whole conversation so far (greedy, ``max_tokens`` new tokens), as OpenAI clients do. Prints
seconds per request for each server, the ratio, and the prompt tokens mlx_agent reports as
cached. Only the bundled model is supported (the export is of a loaded llama GGUF).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlx_agent  # noqa: F401  (fast BLAS before mlx)

SYSTEM = ("You are a careful assistant for a small hardware shop. " + " ".join(
    f"Rule {i}: answer in one short sentence, name the aisle when asked about item {i}, "
    f"and never invent prices." for i in range(1, 31)))
QUESTIONS = [["Where are the hammers?", "And the nails?", "Do you sell glue?", "Thanks!"],
             ["Is the shop open on Sunday?", "What about holidays?", "Can I return tools?",
              "Bye."]]


def export_for_mlx_lm(out: Path) -> Path:
    """The bundled model's weights as an MLX/Hugging Face directory mlx-lm can load."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlx_agent.models import load

    if (out / "config.json").exists():
        return out
    lm = load()
    out.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(lm.model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    args = {k: v for k, v in vars(lm.model.args).items() if not k.startswith("_")}
    (out / "config.json").write_text(json.dumps(args, default=str))
    inner = lm.tokenizer._tokenizer
    inner.chat_template = lm.chat.template
    inner.save_pretrained(str(out))
    return out


def start(cmd: list[str], pattern: str, env=None) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=env)
    deadline = time.time() + 180
    while time.time() < deadline:
        line = proc.stderr.readline()
        m = re.search(pattern, line)
        if m:
            return proc, int(m.group(1))
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit(f"server did not start: {' '.join(cmd)}")


def chat(port: int, model: str, messages: list[dict], max_tokens: int) -> tuple[dict, float]:
    body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens,
                       "temperature": 0.0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        reply = json.loads(r.read())
    return reply, time.perf_counter() - t0


def run_session(port: int, model: str, turns: int, max_tokens: int) -> list[tuple[float, int]]:
    convos = [[{"role": "system", "content": SYSTEM}] for _ in QUESTIONS]
    out = []
    for turn in range(turns):
        for convo, questions in zip(convos, QUESTIONS):
            convo.append({"role": "user", "content": questions[turn % len(questions)]})
            reply, seconds = chat(port, model, convo, max_tokens)
            convo.append({"role": "assistant",
                          "content": reply["choices"][0]["message"]["content"]})
            cached = (reply.get("usage", {}).get("prompt_tokens_details") or {}).get(
                "cached_tokens", 0)
            out.append((seconds, cached))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()
    model_dir = export_for_mlx_lm(Path("build/bench_serve/model"))
    py = sys.executable
    ours, port = start([py, "-m", "mlx_agent.cli.main", "serve", "--port", "0",
                        "--kv-slots", "4"], r"http://127\.0\.0\.1:(\d+)")
    try:
        mine = run_session(port, "smollm2-135m", args.turns, args.max_tokens)
    finally:
        ours.terminate()
        ours.wait()
    free = __import__("socket").socket()
    free.bind(("127.0.0.1", 0))
    peer_port = free.getsockname()[1]
    free.close()
    # mlx-lm's server, with the same BLAS loaded first (as `import mlx_agent` does here)
    code = "import mlx_agent, sys; from mlx_lm.server import main; sys.exit(main())"
    peer, _ = start([py, "-c", code, "--model", str(model_dir), "--port", str(peer_port),
                     "--log-level", "INFO"], r"Starting httpd at .* on port (\d+)",
                    env={**os.environ})
    try:
        theirs = run_session(peer_port, str(model_dir), args.turns, args.max_tokens)
    finally:
        peer.terminate()
        peer.wait()
    print(f"{'request':>8} {'mlx_agent s':>12} {'cached':>7} {'mlx-lm s':>9} {'ratio':>6}")
    for i, ((a, cached), (b, _)) in enumerate(zip(mine, theirs), 1):
        print(f"{i:>8} {a:>12.2f} {cached:>7} {b:>9.2f} {b / a:>5.2f}x")
    ta, tb = sum(a for a, _ in mine), sum(b for b, _ in theirs)
    print(f"{'total':>8} {ta:>12.2f} {'':>7} {tb:>9.2f} {tb / ta:>5.2f}x  "
          f"(mlx-lm time / mlx_agent time; {args.turns} turns x {len(QUESTIONS)} clients, "
          f"{args.max_tokens} new tokens each)")


if __name__ == "__main__":
    main()
