"""Talking to MCP servers, through the official `mcp` SDK's client (docs/architecture/agents.md,
"MCP servers"): list a server's tools, call one. Nothing here is a protocol of our own.

Each listing and each call opens its own session (Streamable HTTP: an `initialize` or
`server/discover` exchange first; stdio: a child process started and stopped), so a server
restarted, re-registered or turned off between two calls needs nothing special; the cost
is a round trip (or a process start) per call.

Over HTTP the SDK is handed an `egress.client`: every connection it opens, redirects
included, goes through the egress policy (public addresses only unless staff allowed the
network, checked on the address connected to). stdio servers run only where the operator
allows them (COLLAB_MCP_STDIO=1), with the SDK's small default environment (HOME, PATH,
...) plus the variables staff named. Secrets are read from allowed tool key variables at
each call and never appear in an error.

Whatever goes wrong ends as an `McpFailure` whose text says what, for the model, the room
and the audit: the server is down, slow, dropped the connection, refused by policy, or
its tool answered an error.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
import mcp_types
from django.conf import settings
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from collab.chat import egress
from collab.chat.agent import ToolFailed
from collab.chat.mcp_models import VARIABLE_RE, McpCall, McpServer

MAX_PAGES = 20  # a listing that pages on beyond this is cut (the SDK's own re-list cap is 100)
MAX_TOOLS = 500  # tools kept per server: more would crowd the model's context anyway
CLIENT_INFO = mcp_types.Implementation(name="collab", version="0.1.0")
Outcome = McpCall.Outcome


class McpFailure(ToolFailed):
    """Why a listing or a call failed (shown to the model, the room and staff; no secret in it)."""

    def __init__(self, message: str, outcome: str = Outcome.FAILED) -> None:
        super().__init__(message)
        self.outcome = outcome


@dataclass(frozen=True)
class Endpoint:
    """A server as registered, read once from the database (the run uses it from the event loop)."""

    server_id: int
    name: str
    transport: str
    url: str
    headers: tuple[tuple[str, str], ...]
    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    timeout_s: float

    @classmethod
    def of(cls, server: McpServer) -> Endpoint:
        return cls(
            server_id=server.pk,
            name=server.name,
            transport=server.transport,
            url=server.url,
            headers=tuple(sorted((server.headers or {}).items())),
            command=server.command,
            args=tuple(server.args or ()),
            env=tuple(sorted((server.env or {}).items())),
            timeout_s=server.timeout_s,
        )


def _filled(name: str, templates: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The templates with each `${VAR}` read from the environment now (egress's key-variable rule)."""

    def value(match: Any) -> str:
        variable = match[1]
        if not egress.tool_key_variable_allowed(variable):
            raise McpFailure(f"{name}: {variable} is not an allowed tool key variable", Outcome.REFUSED)
        found = os.environ.get(variable)
        if not found:
            raise McpFailure(f"{name}: its variable {variable} is not set on the server", Outcome.REFUSED)
        return found

    return {key: VARIABLE_RE.sub(value, template) for key, template in templates}


@asynccontextmanager
async def _client(ep: Endpoint) -> AsyncIterator[Client]:
    """A connected SDK client for one listing or call (its transport closed on exit)."""
    if ep.transport == McpServer.Transport.STDIO:
        if not settings.COLLAB_MCP_STDIO:
            raise McpFailure(f"{ep.name}: stdio servers are off (COLLAB_MCP_STDIO)", Outcome.REFUSED)
        params = StdioServerParameters(command=ep.command, args=list(ep.args), env=_filled(ep.name, ep.env))
        async with Client(stdio_client(params), cache=None, client_info=CLIENT_INFO) as client:
            yield client
        return
    headers = _filled(ep.name, ep.headers)
    # The client's own timeouts are a backstop: the caller cuts the whole exchange at ep.timeout_s.
    http = egress.client(httpx2.Timeout(ep.timeout_s + 1.0))
    http.headers.update(headers)
    async with http, Client(streamable_http_client(ep.url, http_client=http), cache=None, client_info=CLIENT_INFO) as c:
        yield c


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside `exc`: the SDK's task groups wrap a transport's error in groups."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc
        if exc.__cause__ is not None:
            yield from _leaves(exc.__cause__)


def explain(name: str, exc: Exception) -> McpFailure:
    """What went wrong with server `name`, in a sentence (the first cause that says most)."""
    leaves = list(_leaves(exc))
    for leaf in leaves:
        if isinstance(leaf, McpFailure):
            return leaf
        if isinstance(leaf, egress.Refused):  # nothing was sent
            return McpFailure(f"{name}: refused: {leaf}", Outcome.REFUSED)
    for leaf in leaves:
        if isinstance(leaf, httpx2.TimeoutException):
            return McpFailure(f"{name}: the server did not answer in time", Outcome.TIMEOUT)
        if isinstance(leaf, httpx2.ConnectError):
            return McpFailure(f"{name}: could not connect to the server (is it down?)")
        if isinstance(leaf, httpx2.RemoteProtocolError):
            return McpFailure(f"{name}: the server closed the connection mid-call")
        if isinstance(leaf, httpx2.HTTPStatusError):
            return McpFailure(f"{name}: the server answered HTTP {leaf.response.status_code}")
        if isinstance(leaf, httpx2.HTTPError):
            return McpFailure(f"{name}: the connection to the server failed ({type(leaf).__name__})")
        if isinstance(leaf, MCPError):
            if "closed" in leaf.error.message.lower():
                return McpFailure(f"{name}: the server closed the connection mid-call")
            return McpFailure(f"{name}: the server answered an error: {leaf.error.message[:300]}")
        if isinstance(leaf, OSError):
            return McpFailure(f"{name}: could not start the server ({leaf.strerror or type(leaf).__name__})")
    return McpFailure(f"{name}: the server failed ({type(leaves[0]).__name__})")


async def list_tools(ep: Endpoint) -> list[mcp_types.Tool]:
    """Every tool the server lists (up to MAX_TOOLS), or an McpFailure."""
    tools: list[mcp_types.Tool] = []
    try:
        async with asyncio.timeout(ep.timeout_s), _client(ep) as client:
            cursor: str | None = None
            for _ in range(MAX_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools += page.tools
                cursor = page.next_cursor
                if cursor is None or len(tools) >= MAX_TOOLS:
                    break
    except TimeoutError:
        raise McpFailure(f"{ep.name}: no list of tools within {ep.timeout_s:g} s", Outcome.TIMEOUT) from None
    except Exception as exc:
        raise explain(ep.name, exc) from None
    return tools[:MAX_TOOLS]


def result_text(result: mcp_types.CallToolResult) -> str:
    """A tool's result as text: its text blocks; a note for what is no text (images, audio, blobs)."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.EmbeddedResource):
            inner = block.resource
            text = inner.text if isinstance(inner, mcp_types.TextResourceContents) else None
            parts.append(text if text is not None else f"[a resource, {inner.uri}: not text, omitted]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[a link to {block.uri}]")
        else:
            parts.append(f"[{block.type} content omitted]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts)


async def call_tool(ep: Endpoint, tool: str, args: dict[str, Any]) -> str:
    """The tool's result as text (uncut: Toolbox.call caps it), or an McpFailure."""
    try:
        async with asyncio.timeout(ep.timeout_s), _client(ep) as client:
            result = await client.call_tool(tool, args)
    except TimeoutError:
        raise McpFailure(f"{ep.name}: no answer within {ep.timeout_s:g} s", Outcome.TIMEOUT) from None
    except Exception as exc:
        raise explain(ep.name, exc) from None
    text = result_text(result)
    if result.is_error:
        detail = " ".join(text.split())[:300] or "no detail"
        raise McpFailure(f"{ep.name}: the tool {tool[:100]} answered an error: {detail}", Outcome.ERROR)
    return text
