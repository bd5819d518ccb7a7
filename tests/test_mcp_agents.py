"""An agent run that calls MCP tools (issue 37), end to end in-process: real sockets, the
simulated model's `{{tool NAME ARGS}}` script, a real MCP server over Streamable HTTP
(tests/mcp_server.py, a process on loopback) and one over stdio (a child per call).

The tools are offered like the built-ins (`server__tool`), run in parallel, stream into
the run's log, their results are inert text capped like any tool's, every failure (the
tool's error, a hang past the timeout, a server that drops, one that is down, one refused
by the egress policy) ends with a clear note while the run goes on, and each call is
audited without its arguments.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async

from collab.chat.models import Assistant, McpCall, McpServer, McpTool
from collab.chat.replies.tools import MAX_RESULT_CHARS
from collab.chat.services import mcp_catalog
from tests.conftest import World, make_assistant, member
from tests.servers import free_port
from tests.test_agents import parts, run_to_end
from tests.test_mcp import SERVER, McpProcess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("memory_layer", "replies_idle")]


@pytest.fixture(scope="module")
def http_server() -> Iterator[McpProcess]:
    server = McpProcess()
    yield server
    server.stop()


def attach(world: World, http_url: str) -> Assistant:
    """An agent with the HTTP server's and the stdio server's tools, plus two servers that fail."""
    web = McpServer.objects.create(name="web", url=http_url, timeout_s=3.0, enabled=True)
    local = McpServer.objects.create(
        name="local", transport="stdio", command=sys.executable, args=[SERVER, "stdio"], timeout_s=30.0, enabled=True
    )
    assert mcp_catalog.refresh(web).tools == 7 and mcp_catalog.refresh(local).tools == 7
    # Registered as listed earlier: one is down now, the other's address the policy refuses.
    gone = McpServer.objects.create(name="gone", url=f"http://127.0.0.1:{free_port()}/mcp", enabled=True)
    private = McpServer.objects.create(name="private", url="http://10.9.8.7/mcp", enabled=True)
    for server in (gone, private):
        McpTool.objects.create(
            server=server, name="add", offered_as=f"{server.name}__add", input_schema={"type": "object"},
            listed_at=web.listed_at,
        )  # fmt: skip
    agent = make_assistant(world.provider, "planner", is_agent=True)
    agent.mcp_tools.set(McpTool.objects.all())  # bad_schema among them: never offered
    world.room.assistants.add(agent)
    return agent


async def test_an_agent_calls_mcp_tools_over_http_and_stdio_and_each_failure_is_a_note(
    world: World, sim: Any, http_server: McpProcess, settings: Any
) -> None:
    settings.COLLAB_TOOL_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    settings.COLLAB_MCP_STDIO = True
    await database_sync_to_async(attach)(world, http_server.url)
    marker = uuid.uuid4().hex
    script = (
        '{{tool web__add {"a": 2, "b": 3}}}{{tool local__add {"a": 4, "b": 5}}}'
        '{{tool web__echo {"text": "<img src=x onerror=alert(1)>"}}}{{tool web__big {}}}'
        "{{next}}"
        '{{tool web__fail {"why": "testing"}}}{{tool web__hang {}}}{{tool local__die {}}}'
        "{{tool gone__add {}}}{{tool private__add {}}}{{tool web__bad_schema {}}}"
    )
    async with member(world.alice) as alice:
        stored = await run_to_end(alice, f"@planner {marker} {script}", timeout=90)
    shown = parts(stored.reasoning)
    assert "← web__add: 5" in shown and "← local__add: 9" in shown
    assert "← web__echo: <img src=x onerror=alert(1)>" in shown
    notes = [p for p in shown if p.startswith("✗")]
    assert notes == [
        "✗ web__fail: web: the tool fail answered an error: Error executing tool fail",
        "✗ web__hang: web: no answer within 3 s",
        "✗ local__die: local: the server closed the connection mid-call",
        "✗ gone__add: gone: could not connect to the server (is it down?)",
        "✗ private__add: private: refused: 10.9.8.7 is a private address; outbound calls go to public "
        "addresses only, unless the operator allows the network in COLLAB_TOOL_ALLOWED_NETWORKS",
        "✗ web__bad_schema: web__bad_schema is not offered: its input schema is not valid JSON Schema "
        "(at properties/x/type: 'nonsense' is not valid under any of the given schemas)",
    ]
    assert shown[-1] == "✓ Final answer" and stored.status == "done" and stored.text  # the run went on
    # Inert: escaped in every frame the room got.
    frames = "".join(alice.raw)
    assert "<img src=x" not in frames and "&lt;img src=x onerror=alert(1)&gt;" in frames
    # Offered like the built-ins, never the tool whose schema is invalid; results capped.
    requests = [r for r in sim[1].recorded if r.get("tools") and marker in str(r["messages"])]
    offered = {t["function"]["name"] for t in requests[0]["tools"]}
    assert {"calculate", "web__add", "local__add", "gone__add", "private__add"} <= offered
    assert "web__bad_schema" not in offered and "local__bad_schema" not in offered
    told = [m["content"] for m in requests[-1]["messages"] if m.get("role") == "tool"]
    assert told[:2] == ["5", "9"] and len(told[3]) == MAX_RESULT_CHARS and told[3].startswith("xxx")
    assert told[4] == "error: web: the tool fail answered an error: Error executing tool fail"

    def audit() -> list[tuple[str, str, str, str, str, int | None]]:
        return [
            (c.server_name, c.tool_name, c.outcome, c.asker_name, c.room_name, c.reply_id)
            for c in McpCall.objects.order_by("server_name", "tool_name")
        ]

    room = world.room.name
    assert await database_sync_to_async(audit)() == [
        ("gone", "add", "failed", "alice", room, stored.id),
        ("local", "add", "ok", "alice", room, stored.id),
        ("local", "die", "failed", "alice", room, stored.id),
        ("private", "add", "refused", "alice", room, stored.id),
        ("web", "add", "ok", "alice", room, stored.id),
        ("web", "big", "ok", "alice", room, stored.id),
        ("web", "echo", "ok", "alice", room, stored.id),
        ("web", "fail", "error", "alice", room, stored.id),
        ("web", "hang", "timeout", "alice", room, stored.id),
    ]
    details = await database_sync_to_async(lambda: list(McpCall.objects.values_list("detail", flat=True)))()
    assert not any("img src" in d or "testing" in d for d in details)  # never the arguments
