"""Shared fixtures: a real simulated model on a port, the channel layer (in-memory and a
real Redis), a room with members and assistants, and WebSocket clients that log in
with a real session cookie."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from collab.chat import shared
from collab.chat.generation import registry
from collab.chat.lifecycle import runtime
from collab.chat.models import Assistant, Membership, Provider, Room
from collab.chat.replies import early
from collab.chat.services import budgets
from collab.llm.client import aclose_clients
from collab.loadtest.frames import Frames
from collab.simulator.testing import running_simulator_app

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
REDIS_URL = os.environ.get("COLLAB_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def require_redis() -> str:
    """A live Redis, or a skip (a failure in CI, where a missing service is a bug)."""
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except Exception as exc:
        if IN_CI:
            pytest.fail(f"Redis is required in CI and is not answering at {REDIS_URL}: {exc}")
        pytest.skip(f"no Redis at {REDIS_URL}")
    return REDIS_URL


# --- running the suite on several processes (pytest-xdist; Makefile: TEST_WORKERS) ------------


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Two marks the Makefile's passes select on, set before xdist groups the tests.

    `database`: the test reads or writes the test database (the PostgreSQL pass runs these).
    `xdist_group`: a test using a fixture shared by its module (a Daphne cluster, a
    browser) runs in the same worker process as the rest of its module, so that fixture
    starts once (`--dist loadgroup`)."""
    for item in items:
        if "_django_db_helper" in getattr(item, "fixturenames", ()) or item.get_closest_marker("django_db"):
            item.add_marker(pytest.mark.database)
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(d and d[-1].scope == "module" for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.hookimpl(specname="pytest_collection_modifyitems", trylast=True)
def pytest_collection_modifyitems_check_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """After pytest-xdist has grouped the tests (a worker's `loadgroup`), check it did: when
    it does not (pytest 9.2 with xdist 3.8, pyproject.toml), every worker starts its own
    copy of a module's Daphne cluster and browser, and the suite takes twice as long."""
    if not config.getoption("loadgroup", default=False):
        return
    lost = [item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        why = f"pytest-xdist's --dist loadgroup grouped none of {len(lost)} tests (e.g. {lost[0]})"
        print(why, file=sys.__stderr__)  # a worker's error reaches the terminal only as an INTERNALERROR
        raise pytest.UsageError(why)


@pytest.fixture(scope="session", autouse=True)
def _fast_password_hashes() -> Iterator[None]:
    """MD5 for the passwords this process hashes (Django's advice for tests): the default
    PBKDF2 takes 0.2 s a password here, and every `world` makes three. The servers a test
    starts keep the real hasher; their users are made by their own `manage.py`."""
    from django.test.utils import override_settings

    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@pytest.fixture(scope="session", autouse=True)
def _close_database_thread_connections(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """Connections persist (CONN_MAX_AGE), also in the one thread that runs every
    database_sync_to_async call: close them there before the test database is dropped
    (PostgreSQL refuses to drop a database in use)."""
    yield
    from asgiref.sync import SyncToAsync
    from django.db import connections

    with django_db_blocker.unblock():
        SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=30)


# --- the simulated model ----------------------------------------------------------------

SIM_TPS = 1500.0  # fast enough to keep tests quick, slow enough that replies interleave
SIM_TOKENS = 60


@pytest.fixture(scope="session")
def sim() -> Iterator[tuple[str, Any]]:
    with running_simulator_app(tps=SIM_TPS, ttft_ms=5, reply_tokens=SIM_TOKENS, seed=1) as (url, app):
        yield url, app


@pytest.fixture(scope="session")
def sim_url(sim: tuple[str, Any]) -> str:
    return sim[0]


# --- channel layers -----------------------------------------------------------------------


# The layers collab offers (settings.py): in-memory, and on Redis channels_redis's pub/sub
# layer (COLLAB_REDIS_LAYER=pubsub, the default) or its list-based one (=core).
REDIS_BACKENDS = {
    "redis": "channels_redis.pubsub.RedisPubSubChannelLayer",
    "redis-core": "channels_redis.core.RedisChannelLayer",
}


def _layer_config(kind: str, prefix: str) -> dict[str, Any]:
    if kind in REDIS_BACKENDS:
        return {"BACKEND": REDIS_BACKENDS[kind], "CONFIG": {"hosts": [require_redis()], "prefix": prefix}}
    return {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 5000}}


def _use_layer(settings: Any, kind: str) -> None:
    """The channel layer and the shared state (collab/chat/shared/) of one kind: both in
    Redis under a prefix of this test's own, or both in this process's memory."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    settings.CHANNEL_LAYERS = {"default": _layer_config(kind, prefix)}
    settings.COLLAB_SHARED_REDIS_URL = settings.REDIS_URL = REDIS_URL if kind in REDIS_BACKENDS else ""
    settings.COLLAB_REDIS_PREFIX = f"{prefix}:"
    channel_layers.backends.clear()


@pytest.fixture(autouse=True)
def _one_process_per_test() -> Iterator[None]:
    """In-process tests start no background work (lifecycle.py: a test calls what it
    tests, e.g. sweep_once) and begin with empty shared state."""
    runtime.enabled = False
    runtime.stale = False  # a layer another test took away is not this test's (and early.py trusts again)
    shared.reset_memory()
    early.forget_all()  # no room known from another test (their ids are reused)
    budgets.forget_default(known_none=True)  # no staff default, as this test's fresh database has
    yield
    shared.reset_memory()


@pytest.fixture(params=["memory", *(pytest.param(kind, marks=pytest.mark.redis) for kind in REDIS_BACKENDS)])
def layer(request: pytest.FixtureRequest, settings: Any) -> Iterator[str]:
    _use_layer(settings, request.param)
    yield request.param
    channel_layers.backends.clear()


@pytest.fixture
def memory_layer(settings: Any) -> Iterator[None]:
    _use_layer(settings, "memory")
    yield
    channel_layers.backends.clear()


@pytest.fixture
async def replies_idle() -> AsyncIterator[None]:
    """Every test that starts replies ends only when they have all been stored."""
    yield
    async with asyncio.timeout(30):
        await registry.wait_idle()
    await aclose_clients()
    await shared.reset()
    layer = channel_layers.backends.get("default")
    if layer is not None and hasattr(layer, "flush"):
        with contextlib.suppress(Exception):
            await layer.flush()
    # channels_redis' core layer keeps a pool per loop that its flush leaves open: closed
    # here, on the test's loop, or a later test's teardown collects it and warns.
    if layer is not None and hasattr(layer, "close_pools"):
        with contextlib.suppress(Exception):
            await layer.close_pools()


# --- people, rooms, assistants ------------------------------------------------------------


@dataclass
class World:
    alice: User  # owner
    bob: User  # member
    carol: User  # not a member
    room: Room
    provider: Provider
    assistants: dict[str, Assistant]


def make_assistant(provider: Provider, handle: str, model: str = "sim", **kw: Any) -> Assistant:
    kw.setdefault("available_to", Assistant.Availability.EVERYONE)  # new ones are granted-only (README "Security")
    return Assistant.objects.create(
        handle=handle, display_name=handle.upper(), provider=provider, model=model, max_tokens=500, **kw
    )


@pytest.fixture
def world(transactional_db: None, sim_url: str) -> World:
    alice = User.objects.create_user("alice", password="pw-alice-123")
    bob = User.objects.create_user("bob", password="pw-bob-123")
    carol = User.objects.create_user("carol", password="pw-carol-123")
    provider = Provider.objects.create(
        name="sim", base_url=sim_url, default_model="sim", read_timeout_s=2.0, connect_timeout_s=2.0
    )
    assistants = {h: make_assistant(provider, h) for h in ("a", "b")}
    room = Room.objects.create(name="Lab", slug="lab", owner=alice, topic="testing")
    Membership.objects.create(room=room, user=alice, role=Membership.Role.OWNER)
    Membership.objects.create(room=room, user=bob)
    room.assistants.add(*assistants.values())
    return World(alice, bob, carol, room, provider, assistants)


def session_cookie(user: User) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


# --- WebSocket clients --------------------------------------------------------------------


class Member:
    """One connected browser tab, as the wire shows it."""

    def __init__(self, comm: WebsocketCommunicator) -> None:
        self.comm = comm
        self.frames = Frames()
        self.raw: list[str] = []

    async def send(self, **content: Any) -> None:
        import json

        await self.comm.send_to(text_data=json.dumps(content))

    async def post(self, text: str, client_id: str | None = None) -> str:
        cid = client_id or str(uuid.uuid4())
        await self.send(text=text, client_id=cid, HEADERS={"HX-Request": "true"})
        return cid

    async def pump(self, timeout: float = 1.0) -> str:
        frame = await self.comm.receive_from(timeout=timeout)
        self.raw.append(frame)
        self.frames.feed(frame, time.monotonic())
        return frame

    async def until(self, done: Callable[[Frames], bool], timeout: float = 15.0) -> Frames:
        """Read frames until `done` holds: waits for the event, never for a fixed time."""
        async with asyncio.timeout(timeout):
            while not done(self.frames):
                await self.pump(timeout=timeout)
        return self.frames

    async def assert_silent(self, timeout: float = 15.0) -> None:
        """Nothing the server sent this socket before now is still unread: waits for an
        event that proves it, never for a fixed time. First a message of the test's own
        goes through the channel layer (`_layer_barrier`): what was sent through the layer
        before it has reached this process. Then a frame that changes nothing and is
        answered (not JSON: `frame.malformed`; a read-only staff socket answers
        `room.read_only`) goes through this socket: its actions run in order, and what it
        is sent leaves in order (its outbox), so the answer comes after every frame
        already on its way. Anything before the answer, or a close, fails. The answer is
        not recorded (`frames`, `raw`)."""
        await _layer_barrier()
        await self.comm.send_to(text_data=SILENCE_PROBE)
        async with asyncio.timeout(timeout):
            out = await self.comm.receive_output(timeout)
            # Who came and went is told on its own schedule (services/presence.py), whatever
            # the test does: kept, as a page would, and not counted as breaking the silence.
            while out["type"] == "websocket.send" and PRESENCE_CHANGE.fullmatch(out.get("text") or ""):
                self.raw.append(out["text"])
                out = await self.comm.receive_output(timeout)
        if out["type"] == "websocket.close":
            raise AssertionError(f"the socket was closed ({out.get('code')}) instead of staying silent")
        answer = Frames()
        answer.feed(out.get("text") or "")
        if len(answer.errors) != 1 or answer.errors[0][0] not in PROBE_ANSWERS:
            raise AssertionError(f"unexpected frame: {(out.get('text') or str(out))[:300]}")


PRESENCE_CHANGE = re.compile(r'(?:<li id="member-[0-9]+" [^>]*hx-swap-oob="true">.*?</li>)+', re.S)
SILENCE_PROBE = "silent?"  # not JSON: answered `frame.malformed`, with nothing changed or sent to anyone else
PROBE_ANSWERS = ("frame.malformed", "room.read_only")


async def _layer_barrier(timeout: float = 15.0) -> None:
    """A message sent through the channel layer to a channel of the test's own, and
    received: each layer delivers in order what is sent to this process (the in-memory
    one at once; Redis pub/sub on one subscriber connection, in the order Redis ran the
    PUBLISHes; the list layer on one list per process), so whatever was sent to this
    process's channels and groups before it is now in their queues. Sent again each
    second until one arrives: Redis may run the first PUBLISH before the SUBSCRIBE
    that `new_channel` sent without waiting for its answer."""
    layer = channel_layers["default"]
    channel = await layer.new_channel()
    received = asyncio.ensure_future(layer.receive(channel))
    try:
        async with asyncio.timeout(timeout):
            while not received.done():
                await layer.send(channel, {"type": "test.barrier"})
                await asyncio.wait({received}, timeout=1.0)
        received.result()
    finally:
        received.cancel()  # (done: nothing; else the pub/sub layer unsubscribes the channel)


@contextlib.asynccontextmanager
async def connected(
    user: User | None, slug: str, origin: bytes | None = b"http://localhost", cookie: str | None = None
) -> AsyncIterator[tuple[bool, int | None, Member]]:
    from collab.asgi import application

    headers = []
    if origin is not None:
        headers.append((b"origin", origin))
    if user is not None:
        cookie = cookie or await sync_to_async(session_cookie)(user)
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    comm = WebsocketCommunicator(application, f"/ws/rooms/{slug}/", headers=headers)
    ok, code = await comm.connect()
    try:
        yield ok, code, Member(comm)
    finally:
        await comm.disconnect()


@contextlib.asynccontextmanager
async def member(user: User, slug: str = "lab") -> AsyncIterator[Member]:
    """A connected member, past the snapshot frame."""
    async with connected(user, slug) as (ok, _code, m):
        assert ok
        await m.until(lambda f: f.snapshots >= 1)
        yield m


def reply_ids(frames: Frames, role: str = "assistant") -> list[int]:
    return sorted(i for i, r in frames.replies.items() if r.role == role)


def all_final(frames: Frames, n: int) -> bool:
    done = [r for r in frames.replies.values() if r.role == "assistant" and r.final_attrs]
    return len(done) >= n


async def closed(m: Member, timeout: float = 5.0) -> int:
    """Read the socket until the server closes it: the close code (the frames read on the
    way are in m.frames, their errors in m.frames.errors)."""
    async with asyncio.timeout(timeout):
        while True:
            out = await m.comm.receive_output(timeout)
            if out["type"] == "websocket.close":
                return int(out.get("code", 1000))
            m.raw.append(out["text"])
            m.frames.feed(out["text"], time.monotonic())


async def stalling(world: World, *handles: str) -> None:
    """Make assistants (all of them, or those named) stream 8 tokens and then wait, up to
    the provider's 60 s read timeout: still streaming whenever a test acts, however
    loaded the machine is."""

    def change() -> None:
        for handle, assistant in world.assistants.items():
            if not handles or handle in handles:
                assistant.model = "sim+stall@8"
                assistant.save()
        world.provider.read_timeout_s = 60
        world.provider.save()

    await database_sync_to_async(change)()
