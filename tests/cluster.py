"""Several real Daphne processes on one real Redis and one real PostgreSQL database, and
members connected to them over real WebSockets: what an operator runs behind nginx.

Used by tests/test_multiprocess.py and the other *_cluster tests. Each process is
started (tests/servers.py), signalled (SIGTERM, SIGKILL) and waited for as a user's
process manager would.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from collab.loadtest.frames import Frames
from collab.loadtest.wire import member_list
from tests.conftest import require_redis
from tests.servers import login, manage, migrate, postgres_url, start_daphne, stored_replies, throwaway_database

PASSWORD = "cluster-pw-123"


@contextmanager
def postgres_cluster(sim_url: str, prefix: str, setup: str = "", **extra_env: str) -> Iterator[Cluster]:
    """A cluster's environment on a throwaway PostgreSQL database and the local Redis:
    migrated, `SETUP` (plus `setup`) run, its processes stopped at the end. `prefix` keeps
    its Redis keys apart; `extra_env` adds settings (the same for every process)."""
    redis_url = require_redis()
    with throwaway_database(postgres_url()) as database_url:
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "COLLAB_REDIS_PREFIX": f"{prefix}{os.urandom(4).hex()}:",
            "DJANGO_SECRET_KEY": os.urandom(32).hex(),  # one key: a session is valid on every process
            "COLLAB_LLM_BASE_URL": sim_url,
            "COLLAB_LLM_MODEL": "sim",
            "DJANGO_SETTINGS_MODULE": "collab.settings",
            **extra_env,
        }
        env.pop("COLLAB_SHARED_REDIS_URL", None)
        cluster = Cluster(env)
        migrate(cluster.env)
        cluster.manage("shell", "-c", SETUP + setup)
        try:
            yield cluster
        finally:
            cluster.stop_all()


@dataclass
class Process:
    name: str
    url: str
    proc: subprocess.Popen[bytes]

    @property
    def ws(self) -> str:
        return self.url.replace("http", "ws") + "/ws/rooms/lab/"


@dataclass
class Cluster:
    env: dict[str, str]
    processes: list[Process] = field(default_factory=list)

    def start(self, name: str, **extra_env: str) -> Process:
        server = start_daphne({**self.env, **extra_env})
        process = Process(name, server.url, server.proc)
        self.processes.append(process)
        return process

    def manage(self, *args: str) -> str:
        return manage(self.env, *args)

    def replies(self) -> dict[int, dict[str, Any]]:
        return stored_replies(self.env)

    def count_messages(self, role: str = "user") -> int:
        code = f"from collab.chat.models import Message; print(Message.objects.filter(role={role!r}).count())"
        return int(self.manage("shell", "-c", code).strip().splitlines()[-1])

    def stop_all(self) -> None:
        for p in self.processes:
            if p.proc.poll() is None:
                p.proc.send_signal(signal.SIGTERM)
        for p in self.processes:
            try:
                p.proc.wait(30)
            except subprocess.TimeoutExpired:
                p.proc.kill()
                p.proc.wait(10)


class Tab:
    """One browser tab on one process, as the wire shows it."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames = Frames()
        self.members: dict[str, bool] = {}
        self.raw: list[str] = []

    async def read(self) -> None:
        frame = await self.ws.recv()
        assert isinstance(frame, str)
        self.raw.append(frame)
        self.frames.feed(frame, time.monotonic())
        shown = member_list(self.members, frame)
        if shown is not None:
            self.members = shown

    async def until(self, done: Callable[[Tab], bool], timeout: float = 30.0) -> None:
        """Read frames until `done` holds: waits for the event, never for a fixed time."""
        async with asyncio.timeout(timeout):
            while not done(self):
                await self.read()

    async def post(self, text: str) -> None:
        await self.ws.send(json.dumps({"text": text, "client_id": str(uuid.uuid4()), "HEADERS": {}}))

    async def send(self, **content: Any) -> None:
        await self.ws.send(json.dumps(content))

    def assistant_replies(self) -> dict[int, Any]:
        return {i: r for i, r in self.frames.replies.items() if r.role == "assistant"}


class Browser:
    """A logged-in user: one session cookie, valid on every process."""

    def __init__(self, cookie: str) -> None:
        self.cookie = cookie

    def submit(self, process: Process, path: str, fields: dict[str, str]) -> int:
        """Fill in and send the form at `path` on `process`, as the page does (CSRF
        token included); returns the HTTP status (redirects not followed)."""
        import http.cookiejar
        import urllib.error
        import urllib.parse
        import urllib.request

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any, **kwargs: Any) -> None:
                return None

        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), NoRedirect)
        headers = {"Cookie": f"sessionid={self.cookie}"}
        page = opener.open(urllib.request.Request(process.url + path, headers=headers)).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert token is not None, "no form on that page"
        csrf = next(c.value for c in jar if c.name == "csrftoken")
        body = urllib.parse.urlencode({**fields, "csrfmiddlewaretoken": token.group(1)}).encode()
        request = urllib.request.Request(
            process.url + path, data=body, headers={"Cookie": f"sessionid={self.cookie}; csrftoken={csrf}"}
        )
        try:
            return int(opener.open(request).status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    @classmethod
    async def login(cls, process: Process, username: str) -> Browser:
        return cls(await asyncio.to_thread(login, process.url, username, PASSWORD))

    def open(self, process: Process) -> Any:
        return connect(process.ws, origin=process.url, additional_headers={"Cookie": f"sessionid={self.cookie}"})  # type: ignore[arg-type]


SETUP = f"""
from django.contrib.auth.models import User
from collab.chat.services import providers
from collab.chat.services import rooms
from collab.chat.models import Assistant, Membership
alice = User.objects.create_user("alice", password="{PASSWORD}")
bob = User.objects.create_user("bob", password="{PASSWORD}")
room = rooms.create_room(alice, "Lab", topic="two processes")
Membership.objects.create(room=room, user=bob)
provider = providers.ensure_default_assistant().provider
provider.read_timeout_s = 5
provider.save()
room.assistants.add(Assistant.objects.create(handle="long", display_name="LONG", provider=provider, max_tokens=4000, available_to="everyone"))
room.assistants.add(Assistant.objects.create(handle="short", display_name="SHORT", provider=provider, max_tokens=20, available_to="everyone"))
"""


def metric(url: str, token: str, name: str) -> float:
    """One line of a server process's /metrics (COLLAB_METRICS_TOKEN), 0 if absent."""
    request = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0
