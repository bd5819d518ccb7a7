"""The tools each MCP server lists, kept in the database (McpTool; docs/architecture/agents.md,
"MCP servers"): refreshed on demand (the admin's action) and on a schedule
(`manage.py refresh_mcp_tools --every`, started by `serve`).

A listing replaces what was stored: a tool the server no longer lists is deleted (and so
detached from its assistants), a new one is stored unattached. Each tool's schema is
checked: one that cannot be offered (not an object schema, not valid JSON Schema, too
long, or a name the model cannot be given) is kept with the reason, shown in the admin,
and not offered. A failed listing keeps the tools stored before and says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import mcp_types
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from collab.chat.mcp_models import OFFERED_NAME_RE, McpServer, McpTool, check_input_schema, offered_name
from collab.chat.services import mcp

MAX_DESCRIPTION_CHARS = 2000


@dataclass(frozen=True)
class Listing:
    server: str
    tools: int = 0
    invalid: int = 0
    error: str = ""

    def __str__(self) -> str:
        if self.error:
            return f"listing failed: {self.error}"  # the error names the server
        invalid = f", {self.invalid} not offered (see each)" if self.invalid else ""
        return f"{self.server}: {self.tools} tools{invalid}"


def _problems(server: str, tools: list[mcp_types.Tool]) -> dict[str, str]:
    """Why each tool that cannot be offered is not (by the server's name for it)."""
    problems: dict[str, str] = {}
    seen: dict[str, str] = {}
    for tool in tools:
        offered = offered_name(server, tool.name)
        if not OFFERED_NAME_RE.match(offered):
            problems[tool.name] = f"its name makes {offered[:70]!r}, longer than the model's 64 characters"
        elif offered in seen:
            problems[tool.name] = f"its name makes {offered!r}, as {seen[offered][:60]!r} does"
        elif error := check_input_schema(tool.input_schema):
            problems[tool.name] = error
        seen.setdefault(offered, tool.name)
    return problems


@transaction.atomic
def store(server: McpServer, tools: list[mcp_types.Tool]) -> Listing:
    now = timezone.now()
    problems = _problems(server.name, tools)
    by_name = {t.name: t for t in tools}
    server.tools.exclude(name__in=list(by_name)).delete()
    existing = {t.name: t for t in server.tools.all()}
    for name, tool in by_name.items():
        row = existing.get(name) or McpTool(server=server, name=name[:200])
        row.offered_as = offered_name(server.name, name)[:64]
        row.description = (tool.description or tool.title or "")[:MAX_DESCRIPTION_CHARS]
        row.input_schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
        row.schema_error = problems.get(name, "")[:300]
        row.listed_at = now
        row.save()
    server.listed_at = now
    server.list_error = ""
    server.save(update_fields=["listed_at", "list_error"])
    return Listing(server.name, tools=len(by_name), invalid=len(problems))


def refresh(server: McpServer) -> Listing:
    """List the server's tools now and store them (sync: called by the admin and the command)."""
    try:
        tools = async_to_sync(mcp.list_tools)(mcp.Endpoint.of(server))
    except mcp.McpFailure as failure:
        server.list_error = str(failure)[:500]
        server.save(update_fields=["list_error"])
        return Listing(server.name, error=server.list_error)
    return store(server, tools)


def refresh_all(enabled_only: bool = True) -> list[Listing]:
    servers = McpServer.objects.filter(enabled=True) if enabled_only else McpServer.objects.all()
    return [refresh(server) for server in servers]
