"""A sweep never ends a reply whose owner still runs it (collab/chat/lifecycle.py): not
right after this process could not reach Redis for longer than a lease (the owner could
not renew its lease either, and renews it at its next beat), and not right after Redis
restarted (every lease was lost, and the owner restores its record at its next beat).

Against real Redis servers: the shared one behind a TCP proxy that the test cuts (a
network partition: Redis runs on, its clock and uptime too), and one of the test's own
that it restarts. The reply's owner is another process: its beats are the test's calls.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis
from channels.db import database_sync_to_async
from django.utils import timezone

from collab.chat import shared
from collab.chat.lifecycle import ORPHAN_GRACE_S, RELEASE_AFTER_RESTART_S, Runtime
from collab.chat.models import Message
from collab.chat.shared.base import LEASE_TTL_S
from tests.conftest import World, _use_layer, require_redis
from tests.test_outage import OwnRedis

pytestmark = pytest.mark.redis

OWNER = "another-process"  # the reply's owner, still running it on a process of its own


class Partition:
    """A TCP proxy in front of a Redis server: `cut` drops the connections through it and
    refuses new ones, `heal` accepts them again on the same port."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def heal(self) -> None:
        self._server = await asyncio.start_server(self._connect, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        await self._server.wait_closed()

    async def _connect(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.target)
        self._writers |= {client_w, server_w}

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.transport.abort()

        await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))


def streaming_reply(world: World, began_s_ago: float = 0.0) -> int:
    """A reply stored `streaming`, as its owner's checkpoint leaves it."""
    reply = Message.objects.create(
        room=world.room, seq=1, role="assistant", assistant=world.assistants["a"], author_name="A",
        status="streaming", text="so far",
    )  # fmt: skip
    Message.objects.filter(pk=reply.pk).update(created_at=timezone.now() - timedelta(seconds=began_s_ago))
    return reply.pk


async def stored_status(reply_id: int) -> str:
    return str(await Message.objects.filter(pk=reply_id).values_list("status", flat=True).aget())


async def until_lease_ran_out(redis: Any, leases: str, reply_id: int) -> None:
    """Until the reply's lease deadline has passed on Redis's clock (Redis is the only
    witness; the lease is looked at, not taken)."""
    async with asyncio.timeout(LEASE_TTL_S + 10):
        while True:
            seconds, micros = await redis.time()
            if str(reply_id).encode() in await redis.zrangebyscore(leases, "-inf", seconds + micros / 1e6):
                return
            await asyncio.sleep(0.1)


async def test_no_sweep_ends_a_reply_right_after_this_process_could_not_reach_redis(
    world: World, settings: Any
) -> None:
    """Redis runs on while this process cannot reach it for longer than a lease, nor can
    the reply's owner: its lease runs out. Back in touch, this process's next sweep must
    leave the reply alone (a heartbeat failed less than a lease and two beats ago); the
    owner renews its lease at its next beat. Without that guard the sweep takes the
    expired lease and ends the reply `interrupted` under its running owner."""
    url = urlsplit(require_redis())
    partition = Partition(url.hostname or "127.0.0.1", url.port or 6379)
    await partition.heal()
    _use_layer(settings, "memory")  # the layer is not what this is about: frames stay in this process
    settings.COLLAB_SHARED_REDIS_URL = f"redis://127.0.0.1:{partition.port}{url.path}"
    direct = aioredis.Redis.from_url(require_redis())
    process = Runtime()
    try:
        state = shared.backend()
        reply_id = await database_sync_to_async(streaming_reply)(world)
        await state.begin(reply_id, world.room.id, OWNER)
        await process.heartbeat()
        assert not process.stale and await state.uptime_s() >= RELEASE_AFTER_RESTART_S  # no restart here

        await partition.cut()
        await process.heartbeat()
        assert process.stale  # this process could not reach Redis
        await until_lease_ran_out(direct, settings.COLLAB_REDIS_PREFIX + "leases", reply_id)
        await process.heartbeat()  # its last beat in the outage (one every HEARTBEAT_S)
        await partition.heal()

        await process.heartbeat()  # in touch again; the owner has not beaten yet
        assert await process.sweep() == []
        assert await stored_status(reply_id) == "streaming"
        assert await state.leased([reply_id]) == {reply_id}  # its lease is still there to renew
        await state.renew_leases([reply_id])  # the owner's next beat
        assert await state.expired_leases() == []
        assert await stored_status(reply_id) == "streaming"
    finally:
        await partition.cut()
        await direct.aclose()
        await shared.reset()


async def test_no_sweep_ends_a_reply_right_after_redis_restarted(world: World, settings: Any, tmp_path: Path) -> None:
    """Redis restarts between two beats of this process (which so never failed one): every
    lease is gone, and a reply streaming for longer than the orphan grace looks like one
    nobody runs. Its owner restores its record at its next beat; until then (Redis up
    less than RELEASE_AFTER_RESTART_S) no sweep may end it. Without that guard this
    process's sweep ends it `interrupted` under its running owner."""
    redis = OwnRedis(tmp_path)
    redis.start()
    _use_layer(settings, "memory")
    settings.COLLAB_SHARED_REDIS_URL = redis.url
    process = Runtime()
    try:
        state = shared.backend()
        reply_id = await database_sync_to_async(streaming_reply)(world, began_s_ago=ORPHAN_GRACE_S + 60)
        await state.begin(reply_id, world.room.id, OWNER)
        await state.append(reply_id, "so far", 0)
        await process.heartbeat()
        assert not process.stale

        redis.stop()
        redis.start()  # empty: the lease and the live text are gone
        assert await state.leased([reply_id]) == set()
        assert await process.sweep() == []
        assert await stored_status(reply_id) == "streaming"
        await state.restore(reply_id, world.room.id, OWNER, "so far", "")  # the owner's next beat
        assert await state.leased([reply_id]) == {reply_id}
        assert await stored_status(reply_id) == "streaming"
    finally:
        await shared.reset()
        redis.stop()
