"""MCP servers in the admin (issue 37): staff register one (audited), list its tools with
the action (a real server, tests/mcp_server.py), see each tool's schema as inert text,
attach tools to an assistant; stdio is refused unless the operator allows it; the calls'
audit is read-only; `manage.py refresh_mcp_tools` lists every enabled server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from collab.chat.models import AuditEntry, McpServer, McpTool, Provider
from tests.conftest import make_assistant
from tests.test_mcp import McpProcess

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def http_server() -> Iterator[McpProcess]:
    server = McpProcess()
    yield server
    server.stop()


@pytest.fixture
def admin_client(settings: Any) -> Client:
    settings.COLLAB_TOOL_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    client = Client()
    client.force_login(User.objects.create_superuser("boss", password="pw-boss-123"))
    return client


def form(**fields: Any) -> dict[str, Any]:
    base = {
        "name": "web", "transport": "http", "timeout_s": "5", "url": "", "headers": "{}", "command": "",
        "args": "[]", "env": "{}", "enabled": "on", "tools-TOTAL_FORMS": "0", "tools-INITIAL_FORMS": "0",
    }  # fmt: skip
    return {**base, **fields}


def test_staff_register_a_server_list_its_tools_and_see_them(admin_client: Client, http_server: McpProcess) -> None:
    added = admin_client.post("/admin/chat/mcpserver/add/", form(url=http_server.url))
    assert added.status_code == 302, added.content.decode()[:2000]
    server = McpServer.objects.get(name="web")
    assert list(AuditEntry.objects.values_list("action", "detail")) == [("mcp_server.change", "web: created")]
    listed = admin_client.post(
        "/admin/chat/mcpserver/", {"action": "list_tools", "_selected_action": [server.pk]}, follow=True
    )
    assert "Web: 7 tools, 1 not offered (see each)" in listed.content.decode()  # the admin capitalises
    assert server.tools.count() == 7
    page = admin_client.get("/admin/chat/mcpserver/").content.decode()
    assert ">7<" in page  # the tools column
    bad = server.tools.get(name="bad_schema")
    shown = admin_client.get(f"/admin/chat/mcptool/{bad.pk}/change/").content.decode()
    assert "its input schema is not valid JSON Schema" in shown and "nonsense" in shown


def test_a_tools_schema_and_description_are_shown_as_text(admin_client: Client) -> None:
    server = McpServer.objects.create(name="evil", url="https://mcp.example.com/mcp")
    tool = McpTool.objects.create(
        server=server, name="x", offered_as="evil__x", description="<script>alert(1)</script>",
        input_schema={"type": "object", "description": "<b>bold</b>"}, listed_at=timezone.now(),
    )  # fmt: skip
    shown = admin_client.get(f"/admin/chat/mcptool/{tool.pk}/change/").content.decode()
    assert "<script>alert(1)" not in shown and "&lt;script&gt;alert(1)&lt;/script&gt;" in shown
    assert "<b>bold</b>" not in shown and "&lt;b&gt;bold&lt;/b&gt;" in shown
    assert admin_client.get("/admin/chat/mcptool/add/").status_code == 403  # only a listing adds tools


def test_stdio_is_refused_in_the_form_unless_the_operator_allows_it(admin_client: Client, settings: Any) -> None:
    settings.COLLAB_MCP_STDIO = False
    refused = admin_client.post("/admin/chat/mcpserver/add/", form(transport="stdio", command="python"))
    assert refused.status_code == 200 and "COLLAB_MCP_STDIO=1" in refused.content.decode()
    assert not McpServer.objects.exists()
    settings.COLLAB_MCP_STDIO = True
    added = admin_client.post("/admin/chat/mcpserver/add/", form(transport="stdio", command="python", args='["-V"]'))
    assert added.status_code == 302 and McpServer.objects.get().args == ["-V"]


def test_tools_are_attached_on_the_assistants_page_and_calls_are_read_only(admin_client: Client) -> None:
    provider = Provider.objects.create(name="p", base_url="https://llm.example.com/v1", default_model="m")
    agent = make_assistant(provider, "agent", is_agent=True)
    page = admin_client.get(f"/admin/chat/assistant/{agent.pk}/change/").content.decode()
    assert 'name="mcp_tools"' in page
    assert admin_client.get("/admin/chat/mcpcall/").status_code == 200
    assert admin_client.get("/admin/chat/mcpcall/add/").status_code == 403


def test_the_command_lists_every_enabled_server(settings: Any, http_server: McpProcess, capsys: Any) -> None:
    settings.COLLAB_TOOL_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    McpServer.objects.create(name="web", url=http_server.url, enabled=True)
    McpServer.objects.create(name="off", url="http://127.0.0.1:9/mcp", enabled=False)
    call_command("refresh_mcp_tools")
    assert capsys.readouterr().out.strip() == "web: 7 tools, 1 not offered (see each)"
    assert McpTool.objects.filter(server__name="web").count() == 7
    assert not McpTool.objects.filter(server__name="off").exists()
