"""MCP servers' tools as an agent's tools (docs/architecture/agents.md, "MCP servers"): the
ones attached to the assistant, listed with a valid schema, of an enabled server, offered
to the model as `<server>__<tool>` beside the built-ins and the HTTP tools.

A call goes through services/mcp.py (the SDK's client, the egress policy, the server's
timeout) and leaves one audit row (McpCall: who asked, which room, which server and tool,
how long, how it ended; never the arguments), written even when the run is stopped
mid-call. The result is untrusted text, capped by Toolbox.call like every tool's.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from channels.db import database_sync_to_async
from django.contrib.auth.models import User

from collab.chat.mcp_models import McpCall
from collab.chat.models import Assistant, Room
from collab.chat.replies.tool_spec import ToolSpec
from collab.chat.services import mcp

# The engine's cut comes this long after the server's own timeout (services/mcp.py cuts
# the call there, with a clear message and an audit row); it is a backstop.
BACKSTOP_S = 1.0
log = logging.getLogger(__name__)
MAX_DESCRIPTION_CHARS = 1000
_writes: set[asyncio.Task[None]] = set()  # audit rows being written after their run stopped


@dataclass(frozen=True)
class McpTool:
    spec: ToolSpec
    endpoint: mcp.Endpoint
    tool: str  # the server's name for it
    tool_id: int


@dataclass(frozen=True)
class Caller:
    """Who a call is made for, for its audit row."""

    room: Room
    asker_id: int | None
    reply_id: int | None


def attached(assistant: Assistant) -> list[McpTool]:
    """The MCP tools this assistant may call now (sync: reads the database)."""
    if not assistant.pk:
        return []
    rows = (
        assistant.mcp_tools.filter(server__enabled=True, schema_error="")
        .select_related("server")
        .order_by("offered_as")
    )
    return [
        McpTool(
            ToolSpec(
                t.offered_as,
                t.description[:MAX_DESCRIPTION_CHARS] or f"{t.name} (from the MCP server {t.server.name})",
                t.input_schema,
                t.server.timeout_s + BACKSTOP_S,
            ),
            mcp.Endpoint.of(t.server),
            t.name,
            t.pk,
        )
        for t in rows
    ]


def withheld(assistant: Assistant) -> dict[str, str]:
    """The MCP tools attached to this assistant but not offered, and why: a model that calls
    one anyway (a stale plan, a script) is told that, not just "no tool named"."""
    if not assistant.pk:
        return {}
    rows = assistant.mcp_tools.exclude(server__enabled=True, schema_error="").select_related("server")
    return {t.offered_as: t.schema_error or f"its MCP server {t.server.name} is turned off" for t in rows}


def _record(tool: McpTool, caller: Caller, duration_ms: int, outcome: str, detail: str) -> None:
    asker = User.objects.filter(pk=caller.asker_id).only("username").first() if caller.asker_id else None
    McpCall.objects.create(
        asker=asker,
        asker_name=asker.username if asker else "",
        room_id=caller.room.pk,
        room_name=caller.room.name[:120],
        reply_id=caller.reply_id,
        server_id=tool.endpoint.server_id,
        server_name=tool.endpoint.name,
        tool_name=tool.tool[:200],
        duration_ms=duration_ms,
        outcome=outcome,
        detail=detail[:500],
    )


async def call(tool: McpTool, args: dict[str, Any], caller: Caller) -> str:
    """The tool's result (uncut), or an McpFailure (a ToolFailed: shown to the model and the room)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    outcome, detail = McpCall.Outcome.STOPPED, "stopped with its run"
    try:
        text = await mcp.call_tool(tool.endpoint, tool.tool, args)
        outcome, detail = McpCall.Outcome.OK, ""
        return text
    except mcp.McpFailure as failure:
        outcome, detail = McpCall.Outcome(failure.outcome), str(failure)
        raise
    finally:
        ms = round((loop.time() - started) * 1000)
        write = asyncio.ensure_future(database_sync_to_async(_record)(tool, caller, ms, outcome, detail))
        _writes.add(write)
        write.add_done_callback(_writes.discard)
        # Shielded: a stop (a cancel) while the row is written leaves it to finish on its own.
        try:
            await asyncio.shield(write)
        except Exception:  # the call's own outcome goes on to the run; staff find this in the log
            log.exception("the audit row of an MCP call was not written")
