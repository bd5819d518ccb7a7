"""The egress policy of staff-registered HTTP tools (issue 33, item 5; README "Security";
collab/chat/egress.py): no loopback, private, link-local or metadata address unless the
operator allows its network, checked on the address each connection goes to (DNS
rebinding cannot pass); and a tool's key is its own (COLLAB_TOOL_KEY_*), never the model
provider's. Real HTTP servers on loopback addresses, an agent run over a socket."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.test import Client

from collab.chat.models import AuditEntry, Tool
from collab.chat.replies import http_tools
from collab.chat.replies.tool_spec import ToolError, ToolSpec
from tests.conftest import World, make_assistant, member
from tests.test_agents import parts, run_to_end

pytestmark = pytest.mark.django_db(transaction=True)


class Recorder:
    """A real HTTP server on one loopback address; the paths it was POSTed."""

    def __init__(self, address: str, port: int = 0) -> None:
        self.hits: list[str] = []
        hits = self.hits

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                hits.append(f"{self.path} {self.headers.get('Authorization', '')}".strip())
                data = f"hello from {address}".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer((address, port), Handler)
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def internal() -> Iterator[Recorder]:
    """A service on 127.0.0.1, as an internal endpoint on the server's own machine."""
    server = Recorder("127.0.0.1")
    yield server
    server.close()


def tool(url: str, key: str = "") -> http_tools.HttpTool:
    return http_tools.HttpTool(ToolSpec("probe", "probe", {"type": "object", "properties": {}}, 5.0), url, key)


async def call(url: str, key: str = "") -> str:
    return await http_tools.post(tool(url, key), {"q": "x"})


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "127.1.2.3", "localhost", "[::1]", "[::ffff:127.0.0.1]", "0.0.0.0", "169.254.169.254", "10.1.2.3"],
)
async def test_a_tool_never_reaches_a_loopback_private_or_metadata_address(internal: Recorder, host: str) -> None:
    with pytest.raises(ToolError, match=r"^probe: refused: .* outbound calls go to public addresses only"):
        await call(f"http://{host}:{internal.port}/secret")
    assert internal.hits == []


async def test_staff_allow_a_network_explicitly(internal: Recorder, settings: Any) -> None:
    settings.COLLAB_TOOL_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    assert await call(f"http://127.0.0.1:{internal.port}/ok") == "hello from 127.0.0.1"
    with pytest.raises(ToolError, match="refused"):  # the rest of 127/8 is still loopback
        await call(f"http://127.0.0.2:{internal.port}/no")
    assert internal.hits == ["/ok"]


@contextlib.contextmanager
def resolving(name: str, answers: list[str]) -> Iterator[list[str]]:
    """The machine's resolver, answering `name` with the next of `answers` at each lookup
    (as a DNS server an attacker runs does: public when looked at, internal when called)."""
    real = socket.getaddrinfo
    asked: list[str] = []

    def fake(host: Any, port: Any, *args: Any, **kw: Any) -> Any:
        if host == name:
            address = answers[min(len(asked), len(answers) - 1)]
            asked.append(address)
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            return [(family, socket.SOCK_STREAM, 6, "", (address, int(port)))]
        return real(host, port, *args, **kw)

    socket.getaddrinfo = fake
    try:
        yield asked
    finally:
        socket.getaddrinfo = real


async def test_dns_rebinding_is_refused_at_the_address_each_call_connects_to(internal: Recorder, settings: Any) -> None:
    # 127.0.0.2 stands for a public address here (allowed); 127.0.0.1, on the same port, is
    # the internal service the name is rebound to after the first call.
    settings.COLLAB_TOOL_ALLOWED_NETWORKS = ["127.0.0.2/32"]
    public = Recorder("127.0.0.2", internal.port)
    try:
        url = f"http://tools.rebind.test:{internal.port}/lookup"
        with resolving("tools.rebind.test", ["127.0.0.2", "127.0.0.1"]) as asked:
            assert await call(url) == "hello from 127.0.0.2"
            with pytest.raises(ToolError, match=r"tools\.rebind\.test \(127\.0\.0\.1\) is a loopback address"):
                await call(url)
        assert asked == ["127.0.0.2", "127.0.0.1"]
        assert public.hits == ["/lookup"] and internal.hits == []
    finally:
        public.close()


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("100.100.100.200", False),  # shared address space (a cloud's metadata service)
        ("fd00:ec2::254", False),
        ("fe80::1", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("224.0.0.1", False),
        ("::", False),
        ("64:ff9b::7f00:1", False),  # NAT64 of 127.0.0.1
        ("2002:7f00:1::", False),  # 6to4 of 127.0.0.1
        ("64:ff9b::808:808", True),  # NAT64 of 8.8.8.8
    ],
)
def test_the_address_policy(address: str, allowed: bool) -> None:
    from collab.chat import egress

    assert egress.address_allowed(ipaddress.ip_address(address)) is allowed


# --- keys -------------------------------------------------------------------------------------


async def test_a_provider_key_is_never_a_tools_key(
    internal: Recorder, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.COLLAB_TOOL_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    monkeypatch.setenv("COLLAB_LLM_API_KEY", "provider-secret")
    monkeypatch.setenv("COLLAB_KEY_GROQ", "groq-secret")
    monkeypatch.setenv("COLLAB_TOOL_KEY_PROBE", "tool-secret")
    url = f"http://127.0.0.1:{internal.port}/k"
    for name in ("COLLAB_LLM_API_KEY", "COLLAB_KEY_GROQ", "OPENAI_API_KEY"):
        with pytest.raises(ToolError, match=f"its key variable {name} is not an allowed tool key variable"):
            await call(url, name)
    assert internal.hits == []
    assert await call(url, "COLLAB_TOOL_KEY_PROBE") == "hello from 127.0.0.1"
    settings.COLLAB_TOOL_KEY_VARIABLES = ["COLLAB_KEY_GROQ"]  # the operator says so
    await call(url, "COLLAB_KEY_GROQ")
    assert internal.hits == ["/k Bearer tool-secret", "/k Bearer groq-secret"]


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"api_key_env": "COLLAB_LLM_API_KEY"}, "api_key_env", "not an allowed tool key variable"),
        ({"api_key_env": "COLLAB_KEY_WEATHER"}, "api_key_env", "not an allowed tool key variable"),
        ({"url": "http://169.254.169.254/latest/meta-data/"}, "url", "the cloud metadata address"),
        ({"url": "http://localhost:8000/x"}, "url", "a loopback address"),
        ({"url": "http://[fc00::1]/x"}, "url", "a private address"),
    ],
)
def test_the_admin_refuses_a_tool_key_or_address_outside_the_policy(
    transactional_db: None, change: dict[str, str], field: str, says: str
) -> None:
    root = User.objects.create_user("root", is_staff=True, is_superuser=True)
    staff = Client()
    staff.force_login(root)
    form = {
        "name": "probe",
        "description": "d",
        "url": "https://tools.example.com/probe",
        "parameters": json.dumps({"type": "object", "properties": {}}),
        "timeout_s": "5",
        "api_key_env": "COLLAB_TOOL_KEY_PROBE",
        **change,
    }
    response = staff.post("/admin/chat/tool/add/", form)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert says in " ".join(errors.get(field, [])), errors
    assert not Tool.objects.exists() and not AuditEntry.objects.exists()
    assert staff.post("/admin/chat/tool/add/", {**form, "url": "https://tools.example.com/probe", "api_key_env": ""})
    assert Tool.objects.filter(name="probe").exists()


# --- the reported attack: an agent asked to probe an internal endpoint ----------------------------


@pytest.mark.usefixtures("layer", "replies_idle")
async def test_an_agent_run_cannot_make_a_tool_call_an_internal_endpoint(world: World, internal: Recorder) -> None:
    def create() -> None:
        probe = Tool.objects.create(
            name="probe", description="probe", url=f"http://127.0.0.1:{internal.port}/admin", enabled=True
        )
        made = make_assistant(world.provider, "internal", is_agent=True)
        made.tools.add(probe)
        world.room.assistants.add(made)

    await database_sync_to_async(create)()
    async with member(world.alice) as alice:
        stored = await run_to_end(alice, f'@internal {uuid.uuid4().hex} {{{{tool probe {{"q": "x"}}}}}}')
    shown = parts(stored.reasoning)
    refused = [p for p in shown if p.startswith("✗ probe:")]
    assert refused and "refused: 127.0.0.1 is a loopback address" in refused[0], shown
    assert shown[-1] == "✓ Final answer" and stored.status == "done"
    assert internal.hits == []
    assert await sync_to_async(lambda: Tool.objects.count())() == 1
