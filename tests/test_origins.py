"""WebSocket origins checked whole (issue 33, item 4; docs/wire.md, "WebSocket"): scheme,
host and port. An origin is let in when it is the site itself as the deployment serves it
(the scheme of COLLAB_HTTPS, a host of ALLOWED_HOSTS, and the port the socket came to, or
the scheme's default port), or one of CSRF_TRUSTED_ORIGINS exactly. In-process sockets
(WebsocketCommunicator, with and without a Host header) and a real Daphne process."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests import test_e2e
from tests.conftest import World, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


async def handshake(world: World, origin: str | None, host: str | None = None) -> bool:
    """Whether the socket of alice, a member, is accepted with this Origin (and Host)."""
    from collab.asgi import application

    cookie = await sync_to_async(session_cookie)(world.alice)
    headers = [(b"cookie", f"sessionid={cookie}".encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if host is not None:
        headers.append((b"host", host.encode()))
    comm = WebsocketCommunicator(application, "/ws/rooms/lab/", headers=headers)
    ok, _ = await comm.connect()
    await comm.disconnect()
    return ok


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1:1",  # an allowed host on another port: another site
        "https://localhost:9999",
        "ftp://localhost",
        "https://localhost",  # the scheme the deployment does not serve (plain http here)
        "http://localhost:80@evil.example",
        "http://evil.example",
        "http://localhost.evil.example",
        "http://localhost/path",
        "null",
        "",
    ],
)
async def test_an_origin_that_is_not_this_site_is_refused(world: World, origin: str) -> None:
    assert not await handshake(world, origin)


@pytest.mark.parametrize("origin", ["http://localhost", "http://LOCALHOST:80", "http://127.0.0.1", "http://[::1]"])
async def test_this_site_on_its_default_port_is_let_in(world: World, origin: str) -> None:
    assert await handshake(world, origin)


async def test_the_port_the_socket_came_to_is_this_site(world: World) -> None:
    assert await handshake(world, "http://localhost:8000", host="localhost:8000")
    assert not await handshake(world, "http://localhost:8001", host="localhost:8000")
    assert not await handshake(world, "http://localhost:8000", host="localhost:8001")
    # a Host the deployment does not serve proves nothing
    assert not await handshake(world, "http://evil.example:8000", host="evil.example:8000")


async def test_https_deployments_and_trusted_origins(world: World, settings: Any) -> None:
    settings.COLLAB_HTTPS = True
    assert await handshake(world, "https://localhost")
    assert not await handshake(world, "http://localhost")
    settings.CSRF_TRUSTED_ORIGINS = ["https://chat.example.com", "http://tunnel.example.net:8080"]
    assert await handshake(world, "https://chat.example.com")
    assert await handshake(world, "https://chat.example.com:443")
    assert await handshake(world, "http://tunnel.example.net:8080")
    assert not await handshake(world, "http://chat.example.com")  # exactly as listed: scheme, host and port
    assert not await handshake(world, "https://chat.example.com:8443")
    assert not await handshake(world, "http://tunnel.example.net")


# --- a real Daphne ------------------------------------------------------------------------------

recorded_sim = test_e2e.recorded_sim
database = test_e2e.database
daphne = test_e2e.daphne


async def _opens(url: str, origin: str, cookie: str, host: str | None = None) -> bool:
    headers = {"Cookie": f"sessionid={cookie}", **({"Host": host} if host else {})}
    try:
        async with connect(url, origin=origin, additional_headers=headers) as ws:  # type: ignore[arg-type]
            async with asyncio.timeout(20):
                await ws.recv()  # the snapshot: in, and a member
            return True
    except InvalidStatus as refused:
        assert refused.response.status_code == 403
        return False


@pytest.mark.e2e
@pytest.mark.parametrize("daphne", ["memory"], indirect=True)
async def test_a_real_server_lets_in_its_own_origin_only(daphne: test_e2e.Server) -> None:
    cookie = await asyncio.to_thread(test_e2e.login, daphne.url, "alice", "alice-pw-123")
    ws_url = daphne.url.replace("http", "ws") + "/ws/rooms/lab/"
    port = int(daphne.url.rsplit(":", 1)[1])
    assert await _opens(ws_url, daphne.url, cookie)  # the page's own origin, on its port
    assert not await _opens(ws_url, f"http://127.0.0.1:{port + 1}", cookie)
    assert not await _opens(ws_url, f"https://127.0.0.1:{port}", cookie)
    assert not await _opens(ws_url, "ftp://127.0.0.1", cookie)
    assert not await _opens(ws_url, "http://127.0.0.1:1", cookie)
