"""Server latency with concurrent clients in growing conversations: mlx_agent serve vs
mlx-lm's server.

    .venv/bin/python scripts/bench_serve.py [--clients 1,4,8] [--turns 4] [--max-tokens 24]

Both servers run the bundled model with the same weights (float32 on the CPU, the same
BLAS), in their own processes: ``mlx_agent serve --max-batch N``, and ``mlx_lm.server
--decode-concurrency N --prompt-concurrency N`` (its batching) on an MLX export of the very
same weights (written to ``build/bench_serve/model``), N the number of clients. Each client
holds a conversation with a ~700-token system prompt and sends ``--turns`` requests, each
with the whole conversation so far (greedy, streamed, ``max_tokens`` new tokens), as OpenAI
clients do; the clients run at once. For each client count, prints the total wall time and
the p50/p95 time to first token of each server, the ratios (mlx-lm / mlx_agent: above 1 is
faster here), and the prompt tokens mlx_agent reported as cached. Only the bundled model is
supported (the export is of a loaded llama GGUF).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import mlx_agent  # noqa: F401  (fast BLAS before mlx)

SYSTEM = ("You are a careful assistant for a small hardware shop. " + " ".join(
    f"Rule {i}: answer in one short sentence, name the aisle when asked about item {i}, "
    f"and never invent prices." for i in range(1, 31)))
TOPICS = ["hammers", "nails", "glue", "paint", "ladders", "screws", "saws", "tape"]


def questions(client: int) -> list[str]:
    """Client ``client``'s turns: its own topic, so no two conversations are the same."""
    topic = TOPICS[client % len(TOPICS)]
    return [f"Where are the {topic}? (I am customer {client}.)", f"Are the {topic} on sale?",
            f"Can I return {topic}?", "Thanks, bye."]


def export_for_mlx_lm(out: Path) -> Path:
    """The bundled model's weights as an MLX/Hugging Face directory mlx-lm can load: float32,
    dequantized exactly from the GGUF (mlx-lm's fastest CPU path)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlx_agent.models import load
    from mlx_agent.models.cpu_layers import use_reference_layers

    marker = out / "exported-float32"
    if marker.exists():
        return out
    lm = load(weights="float32")
    use_reference_layers(lm.model)
    out.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(lm.model.parameters()))
    assert not any(k.endswith(".scales") for k in weights), "the export must be float32"
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    args = {k: v for k, v in vars(lm.model.args).items() if not k.startswith("_")}
    (out / "config.json").write_text(json.dumps(args, default=str))
    inner = lm.tokenizer._tokenizer
    inner.chat_template = lm.chat.template
    inner.save_pretrained(str(out))
    marker.touch()
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


def chat(port: int, model: str, messages: list[dict], max_tokens: int
         ) -> tuple[str, float, float, int]:
    """One streamed request: (reply text, seconds to the first token, seconds, cached)."""
    body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens,
                       "temperature": 0.0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first, text, cached = None, [], 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter() - t0
                    text.append(piece)
            usage = chunk.get("usage") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", cached)
    seconds = time.perf_counter() - t0
    return "".join(text), first or seconds, seconds, cached


def client(port: int, model: str, i: int, turns: int, max_tokens: int, out: list) -> None:
    convo = [{"role": "system", "content": SYSTEM}]
    for q in questions(i)[:turns]:
        convo.append({"role": "user", "content": q})
        text, ttft, seconds, cached = chat(port, model, convo, max_tokens)
        convo.append({"role": "assistant", "content": text})
        out.append((ttft, seconds, cached))


def session(port: int, model: str, clients: int, turns: int, max_tokens: int) -> dict:
    """All clients at once; total wall time, time-to-first-token percentiles, cached."""
    out: list = []
    threads = [threading.Thread(target=client, args=(port, model, i, turns, max_tokens, out))
               for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ttft = sorted(r[0] for r in out)
    if len(out) != clients * turns:
        raise SystemExit(f"{len(out)} of {clients * turns} requests finished")
    return {"total": time.perf_counter() - t0, "p50": ttft[len(ttft) // 2],
            "p95": ttft[min(len(ttft) - 1, int(round(0.95 * (len(ttft) - 1))))],
            "cached": sum(r[2] for r in out)}


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ours(clients: int, turns: int, max_tokens: int) -> dict:
    proc, port = start([sys.executable, "-m", "mlx_agent.cli.main", "serve", "--no-adapter",
                        "--port", "0", "--kv-slots", "4", "--max-batch", str(clients)],
                       r"http://127\.0\.0\.1:(\d+)")
    try:
        return session(port, "smollm2-135m", clients, turns, max_tokens)
    finally:
        proc.terminate()
        proc.wait()


def theirs(model_dir: Path, clients: int, turns: int, max_tokens: int) -> dict:
    # mlx-lm's server, with the same BLAS loaded first (as `import mlx_agent` does here)
    code = "import mlx_agent, sys; from mlx_lm.server import main; sys.exit(main())"
    proc, port = start([sys.executable, "-c", code, "--model", str(model_dir), "--port",
                        str(free_port()), "--log-level", "INFO", "--decode-concurrency",
                        str(clients), "--prompt-concurrency", str(clients)],
                       r"Starting httpd at .* on port (\d+)", env={**os.environ})
    try:
        return session(port, str(model_dir), clients, turns, max_tokens)
    finally:
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="1,4,8", help="client counts, comma-separated")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()
    model_dir = export_for_mlx_lm(Path("build/bench_serve/model"))
    print(f"{'clients':>7} {'ours s':>8} {'mlx-lm s':>9} {'ratio':>6} {'ours p50/p95 ttft':>18} "
          f"{'mlx-lm p50/p95 ttft':>20} {'ttft p50 ratio':>15} {'cached':>7}", flush=True)
    for n in [int(c) for c in args.clients.split(",")]:
        a = ours(n, args.turns, args.max_tokens)
        b = theirs(model_dir, n, args.turns, args.max_tokens)
        print(f"{n:>7} {a['total']:>8.2f} {b['total']:>9.2f} {b['total'] / a['total']:>5.2f}x "
              f"{a['p50']:>8.2f} / {a['p95']:>5.2f} {b['p50']:>10.2f} / {b['p95']:>5.2f} "
              f"{b['p50'] / a['p50']:>14.2f}x {a['cached']:>7}", flush=True)
    print(f"(ratio: mlx-lm time / mlx_agent time; {args.turns} turns a client, "
          f"{args.max_tokens} new tokens a reply, streamed, greedy)")


if __name__ == "__main__":
    main()
