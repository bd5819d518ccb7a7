"""End to end through a real Daphne process, real WebSocket clients, the real openai
client and the simulated model on a port: exactly what a browser team would do."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from collab.loadtest.frames import Frames
from collab.simulator.app import SimulatorApp
from collab.simulator.config import SimConfig
from collab.simulator.server import bind_socket, build_server
from collab.simulator.text import expected_text
from tests.conftest import require_redis
from tests.servers import login, manage, migrate, running_daphne, stored_replies, throwaway_database, wait_http

pytestmark = pytest.mark.e2e

SIM = SimConfig(tps=400, ttft_ms=20, reply_tokens=80, seed=3)


class Recorder(SimulatorApp):
    """The simulator, keeping each chat request's JSON (what the model was asked)."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            await super().__call__(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.requests.append(json.loads(body))
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await super().__call__(scope, replay, send)


@pytest.fixture(scope="module")
def recorded_sim() -> Iterator[tuple[str, Recorder]]:
    recorder = Recorder(SIM)
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = build_server(recorder, "127.0.0.1", port, log_config=None)
    thread = threading.Thread(target=lambda: server.run(sockets=[sock]), daemon=True)
    thread.start()
    wait_http(f"http://127.0.0.1:{port}/v1/models")
    yield f"http://127.0.0.1:{port}/v1", recorder
    server.should_exit = True
    thread.join(20)
    sock.close()


SETUP = """
from django.contrib.auth.models import User
from collab.chat.services import providers
from collab.chat.services import rooms
from collab.chat.models import Assistant, Membership
alice = User.objects.create_user("alice", password="alice-pw-123")
bob = User.objects.create_user("bob", password="bob-pw-123")
room = rooms.create_room(alice, "Lab", topic="e2e")
Membership.objects.create(room=room, user=bob)
provider = providers.ensure_default_assistant().provider
for h in ("a", "b"):
    room.assistants.add(Assistant.objects.create(handle=h, display_name=h.upper(), provider=provider, max_tokens=60,
                                                 available_to="everyone"))
"""


@dataclass
class Server:
    url: str
    env: dict[str, str]
    pid: int


@pytest.fixture
def database(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """The database Daphne runs on: in the PostgreSQL pass (DATABASE_URL set, `make
    test-postgres`) a throwaway database on that server, else a SQLite file of its own.
    Yields the vendor Django must report and the environment that selects it."""
    server = os.environ.get("DATABASE_URL", "")
    if not server:
        yield "sqlite", {"COLLAB_SQLITE_PATH": str(tmp_path / "e2e.sqlite3")}
        return
    # Created from the server's maintenance database: DATABASE_URL's own need not exist
    # (the tests' database is test_<its name>).
    maintenance = urllib.parse.urlsplit(server)._replace(path="/postgres").geturl()
    with throwaway_database(maintenance) as url:
        yield "postgresql", {"DATABASE_URL": url}


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def daphne(
    request: pytest.FixtureRequest, recorded_sim: tuple[str, Recorder], database: tuple[str, dict[str, str]]
) -> Iterator[Server]:
    vendor, database_env = database
    env = {
        **os.environ,
        "COLLAB_LLM_BASE_URL": recorded_sim[0],
        "COLLAB_LLM_MODEL": "sim",
        "DJANGO_SETTINGS_MODULE": "collab.settings",
    }
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    env.update(database_env)
    if request.param == "redis":
        env["REDIS_URL"] = require_redis()
        # Keys of this run only: a fresh database numbers its replies from 1 again, and a
        # reply of an earlier run stays "ended" in Redis for a minute (shared.KEEP_ENDED_S),
        # which would silence this run's reply of the same id.
        env["COLLAB_REDIS_PREFIX"] = f"e2e{uuid.uuid4().hex[:8]}:"
    migrate(env)
    out = manage(env, "shell", "-c", SETUP + "from django.db import connection\nprint('vendor', connection.vendor)\n")
    assert f"vendor {vendor}" in out.splitlines(), out  # the database meant
    with running_daphne(env) as server:
        yield Server(server.url, env, server.pid)


async def test_two_members_see_two_parallel_replies(daphne: Server, recorded_sim: tuple[str, Recorder]) -> None:
    _, recorder = recorded_sim
    recorder.requests.clear()
    cookies = await asyncio.gather(
        asyncio.to_thread(login, daphne.url, "alice", "alice-pw-123"),
        asyncio.to_thread(login, daphne.url, "bob", "bob-pw-123"),
    )
    ws_url = daphne.url.replace("http", "ws") + "/ws/rooms/lab/"
    views = [Frames(), Frames()]

    async def read(ws: Any, frames: Frames) -> None:
        while not (sum(1 for r in frames.replies.values() if r.final_attrs) >= 2):
            frames.feed(await ws.recv(), time.monotonic())

    async with (
        connect(ws_url, origin=daphne.url, additional_headers={"Cookie": f"sessionid={cookies[0]}"}) as alice,  # type: ignore[arg-type]
        connect(ws_url, origin=daphne.url, additional_headers={"Cookie": f"sessionid={cookies[1]}"}) as bob,  # type: ignore[arg-type]
    ):
        for ws, frames in ((alice, views[0]), (bob, views[1])):
            first = await ws.recv()
            assert isinstance(first, str)
            frames.feed(first, time.monotonic())
            assert frames.snapshots == 1
        await alice.send(json.dumps({"text": "@a @b hello", "client_id": str(uuid.uuid4()), "HEADERS": {}}))
        async with asyncio.timeout(60):
            await asyncio.gather(read(alice, views[0]), read(bob, views[1]))

    stored = stored_replies(daphne.env)
    assert sorted(r["author"] for r in stored.values()) == ["A", "B"]
    # What the simulated model sent, computed from what it was asked.
    sent = sorted(
        expected_text(req["messages"], SIM.seed, req["model"], SIM.reply_tokens, req.get("max_tokens"))
        for req in recorder.requests
    )
    assert len(sent) == 2
    assert sorted(r["text"] for r in stored.values()) == sent
    for frames in views:
        seen = {i: r for i, r in frames.replies.items() if r.role == "assistant"}
        assert set(seen) == set(stored)
        for msg_id, reply in seen.items():
            assert (reply.lost, reply.duplicated, reply.out_of_order, reply.unescaped) == (0, 0, 0, 0)
            assert reply.text == stored[msg_id]["text"]
            assert reply.final_attrs["data-status"] == "done" == stored[msg_id]["status"]
            assert reply.pieces > 1
            offsets = [end for end, _ in reply.piece_times]
            assert offsets == sorted(offsets) and offsets[-1] == len(reply.text)
        a, b = seen.values()
        # Parallel, not one after the other: each started before the other ended.
        assert a.first_piece_at is not None and b.first_piece_at is not None
        assert a.first_piece_at < b.piece_times[-1][1] and b.first_piece_at < a.piece_times[-1][1]
    # The web process (collab/web.py) ran on uvloop and read the model through aiohttp's
    # C parser (collab/llm/client.py): their compiled modules are mapped in it.
    maps = await asyncio.to_thread(Path(f"/proc/{daphne.pid}/maps").read_text)
    assert "/uvloop/loop." in maps
    assert "/aiohttp/_http_parser." in maps
