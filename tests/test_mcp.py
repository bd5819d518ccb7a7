"""MCP servers as agents' tools (issue 37), against real MCP servers built with the `mcp`
SDK's server side (tests/mcp_server.py): one over Streamable HTTP (a process on loopback,
allowed through the egress setting as staff would), one over stdio (a child per call).

Listing (200 tools, an invalid schema), a call with arguments, a tool that errors, one
that hangs past its timeout, a server that drops mid-call, a server that is down, the
egress refusal of loopback and private addresses, key variables in headers, stdio off.
The agent's run end to end is tests/test_mcp_agents.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import mcp_types
import pytest
from django.core.exceptions import ValidationError

from collab.chat.mcp_models import check_input_schema, offered_name
from collab.chat.models import McpCall, McpServer
from collab.chat.replies import mcp_tools
from collab.chat.replies.tool_spec import ToolSpec
from collab.chat.services import mcp, mcp_catalog
from tests.conftest import World
from tests.servers import ROOT, free_port

SERVER = str(ROOT / "tests" / "mcp_server.py")
LOOPBACK = ["127.0.0.1/32"]


class McpProcess:
    """`tests/mcp_server.py http` running: its URL, and its stdout to wait on."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, SERVER, "http", *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until the port is announced (accepting already)
        if not line.startswith("listening "):
            self.stop()
            raise RuntimeError(f"the MCP test server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}/mcp"

    def wait_for_line(self, expected: str) -> None:
        assert self.proc.stdout is not None
        while (line := self.proc.stdout.readline()) and line.strip() != expected:
            pass
        assert line, f"the server exited before printing {expected!r}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture(scope="module")
def http_server() -> Iterator[McpProcess]:
    server = McpProcess("--many", "200")
    yield server
    server.stop()


@pytest.fixture
def allow_loopback(settings: Any) -> None:
    settings.COLLAB_TOOL_ALLOWED_NETWORKS = LOOPBACK  # where the test server listens, as staff would allow it


@pytest.fixture
def stdio_on(settings: Any) -> None:
    settings.COLLAB_MCP_STDIO = True


def http(url: str, timeout_s: float = 10.0, headers: dict[str, str] | None = None) -> mcp.Endpoint:
    return mcp.Endpoint(0, "web", "http", url, tuple((headers or {}).items()), "", (), (), timeout_s)


def stdio(timeout_s: float = 20.0, args: tuple[str, ...] = ()) -> mcp.Endpoint:
    # A Python start and the SDK's import per call: on a busy 2-core machine, seconds.
    return mcp.Endpoint(0, "local", "stdio", "", (), sys.executable, (SERVER, "stdio", *args), (), timeout_s)


@pytest.fixture(params=["http", "stdio"])
def endpoint(request: pytest.FixtureRequest, http_server: McpProcess, settings: Any) -> mcp.Endpoint:
    settings.COLLAB_TOOL_ALLOWED_NETWORKS = LOOPBACK
    settings.COLLAB_MCP_STDIO = True
    return http(http_server.url) if request.param == "http" else stdio()


# --- calls ---------------------------------------------------------------------------------------


async def test_a_call_with_arguments_returns_the_tools_text(endpoint: mcp.Endpoint) -> None:
    assert await mcp.call_tool(endpoint, "add", {"a": 2, "b": 40}) == "42"


async def test_a_tool_that_errors_is_a_clear_failure(endpoint: mcp.Endpoint) -> None:
    with pytest.raises(mcp.McpFailure) as failed:
        await mcp.call_tool(endpoint, "fail", {"why": "testing"})
    assert failed.value.outcome == "error"
    assert str(failed.value).startswith(f"{endpoint.name}: the tool fail answered an error: ")


async def test_arguments_the_tool_refuses_are_its_error(endpoint: mcp.Endpoint) -> None:
    with pytest.raises(mcp.McpFailure) as failed:
        await mcp.call_tool(endpoint, "add", {"a": 2, "b": "many"})
    assert failed.value.outcome == "error" and "valid integer" in str(failed.value)


async def test_a_tool_that_hangs_is_cut_at_the_servers_timeout(http_server: McpProcess, settings: Any) -> None:
    settings.COLLAB_TOOL_ALLOWED_NETWORKS = LOOPBACK
    settings.COLLAB_MCP_STDIO = True
    for ep in (http(http_server.url, timeout_s=0.5), stdio(timeout_s=8.0)):
        with pytest.raises(mcp.McpFailure) as failed:
            await mcp.call_tool(ep, "hang", {})
        assert failed.value.outcome == "timeout"
        assert str(failed.value) == f"{ep.name}: no answer within {ep.timeout_s:g} s"


async def test_a_stdio_server_that_exits_mid_call_is_a_clear_failure(stdio_on: None) -> None:
    with pytest.raises(mcp.McpFailure) as failed:
        await mcp.call_tool(stdio(), "die", {})
    assert failed.value.outcome == "failed"
    assert str(failed.value) == "local: the server closed the connection mid-call"


async def test_an_http_server_killed_mid_call_is_a_clear_failure(allow_loopback: None) -> None:
    doomed = McpProcess()
    try:
        call = asyncio.ensure_future(mcp.call_tool(http(doomed.url), "hang", {}))
        await asyncio.to_thread(doomed.wait_for_line, "hanging")  # the call is in the tool now
        doomed.proc.kill()
        with pytest.raises(mcp.McpFailure) as failed:
            await call
    finally:
        doomed.stop()
    assert failed.value.outcome == "failed"
    assert str(failed.value) == "web: the server closed the connection mid-call"


async def test_a_server_that_is_down_is_a_clear_failure(allow_loopback: None) -> None:
    with pytest.raises(mcp.McpFailure) as failed:
        await mcp.call_tool(http(f"http://127.0.0.1:{free_port()}/mcp"), "add", {"a": 1, "b": 2})
    assert str(failed.value) == "web: could not connect to the server (is it down?)"


async def test_a_wrong_path_is_the_servers_answer(http_server: McpProcess, allow_loopback: None) -> None:
    with pytest.raises(mcp.McpFailure) as failed:
        await mcp.call_tool(http(http_server.url.replace("/mcp", "/nothing")), "add", {"a": 1, "b": 2})
    assert str(failed.value) == "web: the server answered an error: Not Found"


async def test_a_missing_stdio_command_is_a_clear_failure(stdio_on: None) -> None:
    ep = mcp.Endpoint(0, "local", "stdio", "", (), "/nonexistent/mcp-server", (), (), 5.0)
    with pytest.raises(mcp.McpFailure) as failed:
        await mcp.call_tool(ep, "add", {})
    assert str(failed.value).startswith("local: could not start the server (")


async def test_a_result_text_is_returned_whole_for_the_toolbox_to_cap(endpoint: mcp.Endpoint) -> None:
    assert await mcp.call_tool(endpoint, "big", {}) == "x" * 100_000


# --- the egress policy, keys, stdio off ---------------------------------------------------------


async def test_loopback_is_refused_unless_staff_allowed_it(http_server: McpProcess, settings: Any) -> None:
    settings.COLLAB_TOOL_ALLOWED_NETWORKS = []
    with pytest.raises(mcp.McpFailure) as failed:
        await mcp.call_tool(http(http_server.url), "add", {"a": 1, "b": 2})
    assert failed.value.outcome == "refused"
    assert "127.0.0.1 is a loopback address" in str(failed.value)
    with pytest.raises(mcp.McpFailure, match="loopback address"):
        await mcp.list_tools(http(http_server.url))


@pytest.mark.parametrize("host", ["10.1.2.3", "169.254.169.254", "192.168.0.1"])
async def test_private_and_metadata_addresses_are_refused_before_connecting(host: str, settings: Any) -> None:
    settings.COLLAB_TOOL_ALLOWED_NETWORKS = LOOPBACK  # loopback allowed is no licence for the rest
    with pytest.raises(mcp.McpFailure) as failed:
        await mcp.call_tool(http(f"http://{host}:9/mcp", timeout_s=30.0), "add", {})
    assert failed.value.outcome == "refused" and f"{host} is " in str(failed.value)


def test_staff_cannot_register_a_refused_address_or_a_disallowed_key(settings: Any) -> None:
    settings.COLLAB_TOOL_ALLOWED_NETWORKS = []
    server = McpServer(name="docs", url="http://10.0.0.5/mcp", headers={"Authorization": "Bearer ${OPENAI_API_KEY}"})
    with pytest.raises(ValidationError) as refused:
        server.clean()
    assert "a private address" in str(refused.value.message_dict["url"])
    assert "OPENAI_API_KEY is not an allowed tool key variable" in str(refused.value.message_dict["headers"])
    server = McpServer(name="docs", url="https://mcp.example.com/mcp", headers={"X-Key": "s3cret$"})
    with pytest.raises(ValidationError, match=r"a secret itself is never stored here"):
        server.clean()
    McpServer(name="docs", url="https://mcp.example.com/mcp", headers={"X-Key": "${COLLAB_TOOL_KEY_DOCS}"}).clean()


def test_stdio_servers_are_refused_unless_the_operator_allows_them(settings: Any) -> None:
    settings.COLLAB_MCP_STDIO = False
    server = McpServer(name="local", transport="stdio", command="python", args=["-m", "x"])
    with pytest.raises(ValidationError, match="COLLAB_MCP_STDIO=1"):
        server.clean()
    settings.COLLAB_MCP_STDIO = True
    server.clean()


async def test_a_stdio_server_registered_before_the_operator_turned_stdio_off_is_not_run(settings: Any) -> None:
    settings.COLLAB_MCP_STDIO = False
    with pytest.raises(mcp.McpFailure) as failed:
        await mcp.call_tool(stdio(), "add", {"a": 1, "b": 2})
    assert failed.value.outcome == "refused" and "COLLAB_MCP_STDIO" in str(failed.value)


async def test_header_variables_are_read_at_call_time_and_never_shown(
    http_server: McpProcess, allow_loopback: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    ep = http(http_server.url, headers={"Authorization": "Bearer ${COLLAB_TOOL_KEY_MCPTEST}"})
    monkeypatch.delenv("COLLAB_TOOL_KEY_MCPTEST", raising=False)
    with pytest.raises(mcp.McpFailure) as failed:
        await mcp.call_tool(ep, "add", {"a": 1, "b": 2})
    assert str(failed.value) == "web: its variable COLLAB_TOOL_KEY_MCPTEST is not set on the server"
    monkeypatch.setenv("COLLAB_TOOL_KEY_MCPTEST", "s3cret-value")
    assert await mcp.call_tool(ep, "add", {"a": 1, "b": 2}) == "3"
    provider_key = http(http_server.url, headers={"Authorization": "Bearer ${OPENAI_API_KEY}"})
    monkeypatch.setenv("OPENAI_API_KEY", "sk-provider")
    with pytest.raises(mcp.McpFailure) as refused:
        await mcp.call_tool(provider_key, "add", {"a": 1, "b": 2})
    assert "sk-provider" not in str(refused.value) and "not an allowed tool key variable" in str(refused.value)


# --- listing -------------------------------------------------------------------------------------


def test_schemas_that_cannot_be_offered_say_why() -> None:
    assert check_input_schema({"type": "object", "properties": {"a": {"type": "integer"}}}) is None
    assert check_input_schema({"type": "array"}) == "its input schema is of type 'array', not \"object\""
    assert check_input_schema([1]) == "its input schema is not a JSON object"
    bad = check_input_schema({"type": "object", "properties": {"x": {"type": "nonsense"}}})
    assert bad is not None and bad.startswith("its input schema is not valid JSON Schema (at properties/x/type:")
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "d" * 100} for i in range(300)}}
    assert check_input_schema(huge) == "its input schema is longer than 20,000 characters"
    assert offered_name("docs", "read.wiki/structure") == "docs__read_wiki_structure"


@pytest.mark.django_db
def test_listing_over_http_stores_200_tools_and_flags_an_invalid_schema(
    http_server: McpProcess, allow_loopback: None
) -> None:
    server = McpServer.objects.create(name="web", url=http_server.url, enabled=True)
    listing = mcp_catalog.refresh(server)
    assert (listing.tools, listing.invalid, listing.error) == (207, 1, "")
    assert str(listing) == "web: 207 tools, 1 not offered (see each)"
    tools = {t.name: t for t in server.tools.all()}
    assert len(tools) == 207 and {f"t{i:03d}" for i in range(200)} <= set(tools)
    assert tools["t199"].offered_as == "web__t199" and tools["t199"].description == "Numbered tool 199."
    assert tools["add"].input_schema["properties"]["a"]["type"] == "integer" and tools["add"].schema_error == ""
    assert tools["bad_schema"].schema_error.startswith("its input schema is not valid JSON Schema")
    # Listed again: the same rows, no duplicates; a server gone keeps them and says why.
    first_ids = {t.pk for t in server.tools.all()}
    assert mcp_catalog.refresh(server).tools == 207 and {t.pk for t in server.tools.all()} == first_ids
    server.url = f"http://127.0.0.1:{free_port()}/mcp"
    server.save()
    failed = mcp_catalog.refresh(server)
    assert failed.error == "web: could not connect to the server (is it down?)"
    server.refresh_from_db()
    assert server.list_error == failed.error and server.tools.count() == 207


@pytest.mark.django_db
def test_listing_over_stdio_drops_tools_no_longer_listed(stdio_on: None) -> None:
    server = McpServer.objects.create(
        name="local", transport="stdio", command=sys.executable, args=[SERVER, "stdio", "--many", "3"], enabled=True
    )
    assert mcp_catalog.refresh(server).tools == 10
    server.args = [SERVER, "stdio"]
    server.save()
    assert mcp_catalog.refresh(server).tools == 7
    assert sorted(server.tools.values_list("offered_as", flat=True)) == [
        "local__add", "local__bad_schema", "local__big", "local__die", "local__echo", "local__fail", "local__hang",
    ]  # fmt: skip


async def test_a_name_that_resolves_to_loopback_is_refused_at_call_time(http_server: McpProcess, settings: Any) -> None:
    settings.COLLAB_TOOL_ALLOWED_NETWORKS = []  # checked on the address connected to, not on the name
    with pytest.raises(mcp.McpFailure) as failed:
        await mcp.call_tool(http(http_server.url.replace("127.0.0.1", "localhost")), "add", {"a": 1, "b": 2})
    assert failed.value.outcome == "refused" and "localhost (127.0.0.1) is a loopback address" in str(failed.value)


def test_names_the_model_cannot_be_given_are_not_offered() -> None:
    def tool(name: str) -> mcp_types.Tool:
        return mcp_types.Tool(name=name, input_schema={"type": "object"})

    problems = mcp_catalog._problems("docs", [tool("read.page"), tool("read_page"), tool("x" * 70), tool("ok")])
    assert problems == {
        "read_page": "its name makes 'docs__read_page', as 'read.page' does",
        "x" * 70: f"its name makes {('docs__' + 'x' * 70)[:70]!r}, longer than the model's 64 characters",
    }


@pytest.mark.django_db(transaction=True)
async def test_a_call_stopped_with_its_run_is_still_audited(world: World, allow_loopback: None) -> None:
    server = await McpServer.objects.acreate(name="web", url="http://unused.example/mcp")
    doomed = McpProcess()
    try:
        ep = dataclasses.replace(http(doomed.url), server_id=server.pk)
        tool = mcp_tools.McpTool(ToolSpec("web__hang", "", {"type": "object"}, 10.0), ep, "hang", 0)
        caller = mcp_tools.Caller(world.room, world.alice.pk, None)
        call = asyncio.ensure_future(mcp_tools.call(tool, {}, caller))
        await asyncio.to_thread(doomed.wait_for_line, "hanging")
        call.cancel()  # a stop: the run's task is cancelled while it awaits the tool
        with pytest.raises(asyncio.CancelledError):
            await call
    finally:
        doomed.stop()
    row = await McpCall.objects.aget()
    assert (row.outcome, row.asker_name, row.room_name, row.server_id, row.tool_name) == (
        "stopped", "alice", world.room.name, server.pk, "hang",
    )  # fmt: skip
