"""The load test's MCP server (docs/loadtest.md, `--mcp`): two small tools for the agents
scenario's script, built with the `mcp` SDK's server side. `python -m
collab.loadtest.mcp_server --port 0` serves Streamable HTTP on loopback and prints
`mcp server on http://127.0.0.1:PORT/mcp` once it accepts connections; `--stdio` speaks
over stdin and stdout (the server collab starts per call when registered so).
"""

from __future__ import annotations

import argparse
import socket

from mcp.server.mcpserver import MCPServer

server = MCPServer("collab-loadtest")


@server.tool()
def add(a: float, b: float) -> str:
    """Add two numbers."""
    return f"{a + b:g}"


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--stdio", action="store_true")
    opts = parser.parse_args()
    if opts.stdio:
        server.run("stdio")
        return
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", opts.port))
    sock.listen(1024)  # accepting (queued) before the address is announced
    print(f"mcp server on http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
