"""Flood `mlx_agent serve` with idle connections and see what a real client then gets.

Starts the server (bundled model), opens --sockets connections that send nothing, sends one
chat request, counts the 503s the idle ones got, and counts tracebacks in the server's log.
The README's *Connections* figures come from `python scripts/serve_flood.py` (4,200 sockets
against the server's default cap of 4,096 connections, which it prints at start-up). The
server's log goes to a file, not a pipe this script would have to drain while it floods.
Not a test: it needs a free port and about a minute, and whether the one request is served
depends on where it lands in the flood.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=4200)
    parser.add_argument("--request-timeout", type=float, default=20.0)
    parser.add_argument("--log", help="write the server's log here")
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_NOFILE, (args.sockets + 1000,) * 2)  # ours, not its
    log_file = tempfile.NamedTemporaryFile("w+", suffix=".log")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlx_agent.cli.main", "serve", "--port", "0", "--max-tokens", "8",
         "--request-timeout", str(args.request_timeout)],
        stderr=log_file, cwd=ROOT)
    found = None
    while found is None and server.poll() is None:
        time.sleep(0.2)
        found = re.search(r"up to (\d+) connections\) on http://127\.0\.0\.1:(\d+)",
                          Path(log_file.name).read_text())
    if found is None:
        sys.exit("the server did not start:\n" + Path(log_file.name).read_text())
    cap, port = int(found.group(1)), int(found.group(2))
    try:
        limit = next(line.split()[3] for line in open(f"/proc/{server.pid}/limits")
                     if line.startswith("Max open files"))
    except OSError:
        limit = "?"
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5)
            for _ in range(args.sockets)]
    time.sleep(1)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    start = time.time()
    try:
        with urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                headers={"Content-Type": "application/json"}), timeout=30) as reply:
            served = f"{reply.status} in {time.time() - start:.2f} s"
    except (urllib.error.URLError, OSError) as e:
        served = f"not served ({e})"
    refused = 0
    for s in idle:
        s.settimeout(0.2)
        try:
            refused += s.recv(20).startswith(b"HTTP/1.1 503")
        except OSError:
            pass
        s.close()
    server.terminate()
    server.wait(timeout=30)
    log = Path(log_file.name).read_text()
    if args.log:
        Path(args.log).write_text(log)
    print(f"server: up to {cap} connections, descriptor limit {limit}; {args.sockets} idle "
          f"sockets, {refused} got a 503")
    print(f"one chat request during the flood: {served}")
    print(f"server log: {len(log.splitlines())} lines, {log.count('Traceback')} tracebacks")


if __name__ == "__main__":
    main()
