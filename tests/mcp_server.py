"""A small MCP server for the tests, written with the official SDK (stdio transport).

``python tests/mcp_server.py [MODE [PIDFILE]]``: ``ok`` (the default) serves add, fail, crash, slow,
shell, connect, stray (writes a line that is not UTF-8), picture and a badly-typed ``broken``
tool; ``latin1`` writes a Latin-1 banner on stdout first, then serves them; ``exit`` dies
before the handshake; ``hang`` never answers it; ``second`` serves only another ``add``; ``http`` serves the ``ok`` tools over
Streamable HTTP on 127.0.0.1 (``http PIDFILE PORT``). Each start appends its pid to
PIDFILE when one is given, so tests can check that no server outlives the agent.
"""

import os
import socket
import sys
import time

mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
if len(sys.argv) > 2:  # first: a test's short start-up timeout may end us during the import
    with open(sys.argv[2], "a") as f:
        f.write(f"{os.getpid()}\n")

from mcp.server.mcpserver import Image, MCPServer  # noqa: E402
if mode == "exit":
    print("cannot open the database", file=sys.stderr, flush=True)
    sys.exit(3)
if mode == "hang":
    print("waiting for something that never comes", file=sys.stderr, flush=True)
    time.sleep(600)

server = MCPServer("test")
if mode == "latin1":  # a banner in Latin-1 on stdout before the handshake, then the ok tools
    os.write(1, b"d\xe9marrage du serveur\n")

if mode == "second":
    @server.tool()
    def add(a: int, b: int) -> str:
        """Add as the second server does."""
        return f"second {a + b}"
else:
    @server.tool()
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    @server.tool()
    def fail() -> str:
        """Always fails."""
        raise ValueError("this tool always fails")

    @server.tool()
    def crash() -> str:
        """Kills the server."""
        os._exit(7)

    @server.tool()
    def slow(seconds: float) -> str:
        """Sleeps."""
        time.sleep(seconds)
        return "done"

    @server.tool()
    def shell(command: str) -> str:
        """Runs a bash command in the server's directory (what a hostile server may do)."""
        import subprocess

        r = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        return f"exit {r.returncode} {r.stdout}{r.stderr}"

    @server.tool()
    def connect(port: int) -> str:
        """Opens a TCP connection to 127.0.0.1:port."""
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        except OSError as e:
            return f"refused: {e}"
        return "connected"

    @server.tool()
    def stray() -> str:
        """Writes a line that is not UTF-8 (nor JSON-RPC) to its stdout, then answers."""
        os.write(1, b"caf\xe9 \xff\n")
        return "answered"

    @server.tool()
    def picture() -> Image:
        """A tiny PNG."""
        return Image(data=b"\x89PNG" + b"\0" * 96, format="png")

    @server.tool()
    def broken(x: int) -> str:
        """Its schema is replaced by an invalid one below."""
        return str(x)

    server._tool_manager._tools["broken"].parameters = {
        "type": "object", "properties": {"x": {"type": "int"}}}

if mode == "http":  # Streamable HTTP on 127.0.0.1, the port in argv[3]
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[3]))
else:
    server.run()
