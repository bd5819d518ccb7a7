"""The shared state sharded over three real Redis servers of the test's own (loopback,
ports 6390-6399): every key on the server its room or reply hashes to, scripts never
across servers, what asks about everything asking every server, and one server
restarted (docs/architecture.md#a-sharding). The same servers carry the scale-out
tests of two Daphnes in tests/test_sharded_cluster.py.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from channels.layers import channel_layers, get_channel_layer
from channels_redis.utils import _consistent_hash

from collab.chat import broadcast, shared
from collab.chat.events import room_group
from collab.chat.shared.base import LiveView
from collab.chat.shared.sharded import ShardedState, shard_index, split_urls
from tests.conftest import IN_CI, REDIS_BACKENDS

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

PORTS = range(6390, 6400)  # the range tests may start Redis servers on (other runs may hold some)


class RedisServer:
    """A redis-server that keeps nothing on disk: stopped and started again, it is a
    restart as production sees one (empty)."""

    def __init__(self, port: int, tmp: Path) -> None:
        self.port, self.tmp = port, tmp
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.tmp)],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client().ping()
                return
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # no save, no goodbye: everything it held is gone
            self.proc.wait(10)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # as redis-server binds: a TIME_WAIT of the last run is free
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_shards(count: int, tmp: Path) -> list[RedisServer]:
    """`count` Redis servers on free ports of PORTS; a failure in CI without redis-server."""
    if subprocess.run(["which", "redis-server"], capture_output=True).returncode:
        if IN_CI:
            pytest.fail("redis-server is required in CI (the sharded Redis tests start their own)")
        pytest.skip("no redis-server binary")
    servers: list[RedisServer] = []
    for port in PORTS:
        if len(servers) == count:
            break
        if not _port_free(port):
            continue
        server = RedisServer(port, tmp)
        try:
            server.start()
        except RuntimeError:  # taken between the check and the start
            server.stop()
            continue
        servers.append(server)
    if len(servers) < count:
        stop_shards(servers)
        pytest.fail(f"fewer than {count} free ports in {PORTS.start}-{PORTS.stop - 1} for redis-server")
    return servers


def stop_shards(servers: list[RedisServer]) -> None:
    for server in servers:
        server.stop()


def three_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisServer]]:
    """Three Redis servers for a module's tests (the `shards` fixture here and in
    tests/test_sharded_cluster.py)."""
    servers = start_shards(3, tmp_path_factory.mktemp("shards"))
    try:
        yield servers
    finally:
        stop_shards(servers)


shards = pytest.fixture(scope="module", name="shards")(three_servers)


@pytest.fixture
async def state(shards: list[RedisServer]) -> AsyncIterator[ShardedState]:
    prefix = f"sh{os.urandom(3).hex()}:"
    sharded = ShardedState(split_urls(",".join(s.url for s in shards)), prefix)
    sharded.prefix = prefix  # type: ignore[attr-defined]
    try:
        yield sharded
    finally:
        await sharded.close()


def holders(shards: list[RedisServer], key: str) -> list[int]:
    """The indexes of the servers that hold `key`."""
    return [n for n, s in enumerate(shards) if s.client().exists(key)]


def test_the_hash_is_the_channel_layers() -> None:
    names = [*range(500), *(f"collab:asgi__group__room.{n}" for n in range(500))]
    for count in (1, 2, 3, 5):
        assert [shard_index(n, count) for n in names] == [_consistent_hash(str(n), count) for n in names]
    assert split_urls(" redis://a:1/0 , redis://b:2/0,") == ["redis://a:1/0", "redis://b:2/0"]


async def test_each_room_and_reply_lives_on_the_server_it_hashes_to(
    state: ShardedState, shards: list[RedisServer]
) -> None:
    p = state.prefix  # type: ignore[attr-defined]
    rooms = range(1, 13)
    for room in rooms:
        assert await state.join(room, 7, f"sock{room}")
        await state.begin(1000 + room, room, "P1")
        await state.append(1000 + room, f"text of {room}", 0)
    for room in rooms:
        assert holders(shards, f"{p}pr:{room}") == [shard_index(room, 3)]
        assert holders(shards, f"{p}r:{1000 + room}:t") == [shard_index(1000 + room, 3)]
        assert await state.online(room) == {7}
    # Really spread: every server holds some room's presence and some reply's text.
    assert {shard_index(room, 3) for room in rooms} == {0, 1, 2}
    views = await state.read([1000 + room for room in rooms] + [99999])
    assert views == {1000 + room: LiveView(f"text of {room}") for room in rooms}
    assert await state.leased([1001, 1005, 99999]) == {1001, 1005}
    await state.end(1001)
    assert await state.leased([1001, 1005]) == {1005}
    assert (await state.read([1001]))[1001].ended


async def test_a_dead_owners_leases_and_sockets_are_found_on_every_server(
    state: ShardedState, shards: list[RedisServer]
) -> None:
    p = state.prefix  # type: ignore[attr-defined]
    replies = list(range(2000, 2009))
    for reply in replies:
        await state.begin(reply, 1, "dead")
    assert {shard_index(r, 3) for r in replies} == {0, 1, 2}
    for server in shards:  # the owner stopped renewing: each server's leases ran out
        for reply in replies:
            server.client().zadd(f"{p}leases", {str(reply): 0}, xx=True)  # only those it holds
    assert sorted(await state.expired_leases()) == replies
    assert await state.expired_leases() == []  # each handed out once
    for room in (1, 2, 3, 4, 5, 6):
        await state.join(room, 3, "gone")
        shards[shard_index(room, 3)].client().zadd(f"{p}pr:{room}", {"3:gone": 0})  # its process died: no renewal
    assert sorted(await state.sweep_presence()) == [1, 2, 3, 4, 5, 6]
    # Renewed from a process's heartbeat, each socket back on its own room's server.
    added = await state.renew_presence([(room, 3, "back") for room in (1, 2, 3)])
    assert sorted(added) == [1, 2, 3]
    for room in (1, 2, 3):
        assert holders(shards, f"{p}pr:{room}") == [shard_index(room, 3)]


async def test_a_piece_is_published_in_one_step_only_on_its_replys_server(
    state: ShardedState, shards: list[RedisServer]
) -> None:
    reply = 3001
    await state.begin(reply, 1, "P1")
    home = shard_index(reply, 3)
    here = next(f"ch{n}" for n in range(100) if shard_index(f"ch{n}", 3) == home)
    there = next(f"ch{n}" for n in range(100) if shard_index(f"ch{n}", 3) != home)
    listener = shards[home].client().pubsub()
    listener.subscribe(here)
    assert listener.get_message(timeout=5)["type"] == "subscribe"  # type: ignore[index]
    assert await state.append_and_publish(reply, "a", 0, here, b"frame")
    message = listener.get_message(timeout=5)
    assert message is not None and message["data"] == b"frame"
    assert not await state.append_and_publish(reply, "b", 1, there, b"frame")  # the caller sends it
    assert (await state.read([reply]))[reply].text == "a"  # and nothing was appended
    listener.close()


async def test_the_uptime_is_the_youngest_servers(state: ShardedState, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that restarted (its uptime back near 0) makes the whole shared state count
    as restarted (lifecycle: its part of the leases and presence is gone)."""
    for shard, uptime in zip(state.shards, (100.0, 5.0, 50.0), strict=True):

        async def fixed(uptime: float = uptime) -> float:
            return uptime

        monkeypatch.setattr(shard, "uptime_s", fixed)
    assert await state.uptime_s() == 5.0


async def test_a_restarted_server_loses_only_its_own_keys(state: ShardedState, shards: list[RedisServer]) -> None:
    p = state.prefix  # type: ignore[attr-defined]
    replies = list(range(4000, 4012))
    for reply in replies:
        await state.begin(reply, 1, "P1")
        await state.append(reply, "x", 0)
    gone = shard_index(replies[0], 3)
    shards[gone].stop()
    with pytest.raises(Exception):  # noqa: B017  (which error depends on the moment: away is away)
        await state.uptime_s()
    shards[gone].start()
    assert await state.uptime_s() >= 0  # every server answers again
    kept = await state.read(replies)
    assert set(kept) == {r for r in replies if shard_index(r, 3) != gone}
    assert holders(shards, f"{p}leases") == sorted({0, 1, 2} - {gone})


async def test_pieces_reach_the_rooms_group_whichever_server_holds_the_reply(
    shards: list[RedisServer], settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """broadcast.piece_to_room on the pub/sub layer sharded over the same servers: one
    command when the room's group channel is on its reply's server, two when it is not;
    the frame reaches the group's member either way."""
    urls = ",".join(s.url for s in shards)
    prefix = f"bc{os.urandom(3).hex()}"
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": REDIS_BACKENDS["redis"], "CONFIG": {"hosts": split_urls(urls), "prefix": prefix}}
    }
    settings.COLLAB_SHARED_REDIS_URL = settings.REDIS_URL = urls
    settings.COLLAB_REDIS_PREFIX = f"{prefix}:"
    channel_layers.backends.clear()
    try:
        layer = get_channel_layer()
        assert layer is not None
        state = shared.backend()
        assert isinstance(state, ShardedState)
        room = 5
        group_shard = shard_index(f"{prefix}__group__{room_group(room)}", 3)
        same = next(r for r in range(100, 200) if shard_index(r, 3) == group_shard)
        other = next(r for r in range(100, 200) if shard_index(r, 3) != group_shard)
        channel = await layer.new_channel()
        await broadcast.join(room_group(room), channel)
        two_steps: list[int] = []
        plain_append = state.append

        async def append(reply_id: int, *args: Any, **kwargs: Any) -> None:
            two_steps.append(reply_id)
            await plain_append(reply_id, *args, **kwargs)

        monkeypatch.setattr(state, "append", append)
        for reply in (same, other):
            await state.begin(reply, room, "P1")
            await broadcast.piece_to_room(room, reply, "hi", 0, {"type": "room.frame", "kind": "piece", "n": reply})  # type: ignore[typeddict-item]
            async with asyncio.timeout(5):
                assert (await layer.receive(channel))["n"] == reply
        assert two_steps == [other]  # the reply on the group's server took one command
        assert {r: v.text for r, v in (await state.read([same, other])).items()} == {same: "hi", other: "hi"}
    finally:
        await shared.reset()
        channel_layers.backends.clear()


async def test_sync_code_reads_a_rooms_presence_on_its_server(
    state: ShardedState, shards: list[RedisServer], settings: Any
) -> None:
    settings.COLLAB_SHARED_REDIS_URL = ",".join(s.url for s in shards)
    settings.COLLAB_REDIS_PREFIX = state.prefix  # type: ignore[attr-defined]
    rooms = [next(r for r in range(20, 100) if shard_index(r, 3) == n) for n in range(3)]  # one on each server
    for room in rooms:
        await state.join(room, room, "s")
    for room in rooms:
        assert await asyncio.to_thread(shared.online_sync, room) == {room}


def test_a_process_pings_itself_through_every_server(shards: list[RedisServer], settings: Any) -> None:
    settings.REDIS_URL = ",".join(s.url for s in shards)
    for backend, hashed in ((REDIS_BACKENDS["redis"], "p__group__{}"), (REDIS_BACKENDS["redis-core"], "{}")):
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": backend, "CONFIG": {"hosts": [], "prefix": "p"}}}
        groups = broadcast.server_groups("collab.ping.host:12:ab")
        assert all(g.startswith("collab.ping.host-12-ab.") for g in groups)
        assert [shard_index(hashed.format(g), 3) for g in groups] == [0, 1, 2]
    settings.REDIS_URL = shards[0].url
    assert broadcast.server_groups("collab.ping.x") == []  # one server: the ping as before
