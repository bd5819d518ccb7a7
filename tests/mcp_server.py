"""A real MCP server for the tests, built with the `mcp` SDK's server side (MCPServer):
`python tests/mcp_server.py http` serves Streamable HTTP on a free loopback port and
prints `listening PORT` once it accepts connections; `python tests/mcp_server.py stdio`
speaks over its stdin and stdout. `--many N` lists N more tools (t000, t001, ...).

Its tools: add (a call with arguments), echo (untrusted text back), fail (the tool
answers an error), hang (never answers; prints `hanging` on stdout over HTTP, so a test
can kill the process mid-call), die (the process exits mid-call), bad_schema (listed
with an input schema that is not valid JSON Schema), big (a result far over any cap).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import anyio
from mcp.server.mcpserver import MCPServer

server = MCPServer("collab-test")
announce_hang = False


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return text


@server.tool()
def fail(why: str) -> str:
    """Always fails."""
    raise ValueError(f"failed on purpose: {why}")


@server.tool()
async def hang() -> str:
    """Never answers."""
    if announce_hang:
        print("hanging", flush=True)
    await anyio.sleep_forever()
    return ""


@server.tool()
def die() -> str:
    """The server process exits while this call is in flight."""
    os._exit(3)


@server.tool()
def bad_schema(x: int = 0) -> str:
    """Listed with an invalid input schema (set below)."""
    return "never offered"


@server.tool()
def big() -> str:
    """A result of 100,000 characters."""
    return "x" * 100_000


# A schema no JSON Schema validator accepts: "nonsense" is no type.
server._tool_manager.get_tool("bad_schema").parameters = {
    "type": "object",
    "properties": {"x": {"type": "nonsense"}},
}


def many(n: int) -> None:
    for i in range(n):

        def numbered(i: int = i) -> str:
            return f"tool {i}"

        server.add_tool(numbered, name=f"t{i:03d}", description=f"Numbered tool {i}.")


def serve_http() -> None:
    import uvicorn

    global announce_hang
    announce_hang = True
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # accepting (queued) before the port is announced
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning", lifespan="on")
    print(f"listening {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["http", "stdio"])
    parser.add_argument("--many", type=int, default=0)
    opts = parser.parse_args()
    many(opts.many)
    if opts.transport == "http":
        serve_http()
    else:
        server.run("stdio")
    sys.exit(0)
