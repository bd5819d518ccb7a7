"""The shared state's promises about a live reply's record, on both backends (this
process's memory, and Redis): a reply that was ended is never written to or brought back,
a new reply never inherits an earlier one's record, and a record Redis lost is refused,
not silently restarted mid-text, until its owner restores it whole."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import hiredis
import pytest
import redis.asyncio as aioredis
from redis.exceptions import TimeoutError as RedisTimeout

from collab.chat import shared
from collab.chat.lifecycle import RELEASE_AFTER_RESTART_S
from collab.chat.shared.base import ReplyEnded, SharedState, StateLost
from collab.chat.shared.memory import MemoryState
from collab.chat.shared.redis import RedisState, _Connection, _connection_class
from tests.conftest import _use_layer, require_redis
from tests.test_outage import OwnRedis


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def state(request: pytest.FixtureRequest, settings: Any) -> AsyncIterator[SharedState]:
    if request.param == "redis":
        require_redis()
    _use_layer(settings, request.param)
    yield shared.backend()
    await shared.reset()


async def test_an_ended_reply_takes_no_piece_and_is_not_restored(state: SharedState) -> None:
    await state.begin(1, 10, "p1")
    await state.append(1, "Hello", 0)
    await state.end(1)
    with pytest.raises(ReplyEnded):
        await state.append(1, " again", 5)
    with pytest.raises(ReplyEnded):  # an owner back from an outage cannot revive it
        await state.restore(1, 10, "p1", "Hello again", "")
    view = (await state.read([1]))[1]
    assert (view.text, view.ended) == ("Hello", True)


async def test_a_new_reply_does_not_inherit_an_ended_one_with_its_id(state: SharedState) -> None:
    """Ids come from the database: a fresh database numbers replies from 1 again while
    the last run's ended records are still kept (KEEP_ENDED_S)."""
    await state.begin(1, 10, "p1")
    await state.append(1, "old text", 0)
    await state.end(1)
    await state.begin(1, 11, "p2")
    await state.append(1, "new", 0)
    view = (await state.read([1]))[1]
    assert (view.text, view.ended) == ("new", False)
    assert await state.leased([1]) == {1}


@pytest.mark.redis
async def test_a_record_redis_lost_is_refused_until_restored_whole(settings: Any) -> None:
    require_redis()
    _use_layer(settings, "redis")
    state = shared.backend()
    assert isinstance(state, RedisState)
    try:
        await state.begin(7, 10, "p1")
        await state.append(7, "The first half, ", 0)
        await state.redis.delete(state._r(7), state._r(7) + ":t", state.p + "leases")  # as after a restart
        with pytest.raises(StateLost):  # appending would start the text mid-way
            await state.append(7, "the second half.", 16)
        assert await state.read([7]) == {}
        await state.restore(7, 10, "p1", "The first half, the second half.", "writing…")
        await state.append(7, " The end.", 32)
        view = (await state.read([7]))[7]
        assert view.text == "The first half, the second half. The end."
        assert view.state == "writing…"
        assert await state.leased([7]) == {7}  # its lease is back too: no sweep takes it for dead
    finally:
        await shared.reset()


@pytest.mark.redis
async def test_a_piece_is_recorded_once_and_only_where_the_owner_says(settings: Any) -> None:
    """A retried call (its reply lost on the way) appends nothing twice; a text of another
    length than the owner's (Redis reloaded an older copy) is refused, not extended."""
    require_redis()
    _use_layer(settings, "redis")
    state = shared.backend()
    assert isinstance(state, RedisState)
    try:
        await state.begin(8, 10, "p1")
        await state.append(8, "héllo ", 0)
        await state.append(8, "héllo ", 0)  # the same call again
        assert (await state.read([8]))[8].text == "héllo "
        await state.append(8, "wörld", 7)  # bytes: é is two
        with pytest.raises(StateLost):
            await state.append(8, "!", 3)  # the owner thinks the text is shorter: restore, not extend
        assert (await state.read([8]))[8].text == "héllo wörld"
    finally:
        await shared.reset()


async def test_memory_state_never_reports_a_restart() -> None:
    """Leases are trusted only once the state has been up a while (lifecycle.sweep_once):
    one process's memory lives exactly as long as its replies."""
    assert await MemoryState().uptime_s() == float("inf")


@pytest.mark.redis
async def test_redis_uptime_grows_and_starts_again_at_a_restart(settings: Any, tmp_path: Path) -> None:
    """Redis's own uptime, which the sweeps wait on after a restart (lifecycle.sweep_once):
    it counts up while Redis runs, and from zero again once it restarted (empty)."""
    redis = OwnRedis(tmp_path)
    redis.start()
    _use_layer(settings, "memory")
    settings.COLLAB_SHARED_REDIS_URL = redis.url
    try:
        state = shared.backend()
        first = await state.uptime_s()
        assert 0 <= first < RELEASE_AFTER_RESTART_S  # it has just started
        async with asyncio.timeout(5):  # it counts whole seconds
            while (later := await state.uptime_s()) <= first:  # noqa: ASYNC110
                await asyncio.sleep(0.1)  # Redis's clock is the only witness
        redis.stop()
        redis.start()
        assert await state.uptime_s() < later
    finally:
        await shared.reset()
        redis.stop()


def test_a_plain_redis_url_gets_the_connection_that_writes_in_place() -> None:
    expected = {"connection_class": _Connection} if sys.version_info < (3, 12) else {}
    assert _connection_class("redis://127.0.0.1:6379/0") == expected
    assert _connection_class("REDIS://127.0.0.1:6379/0") == expected
    # TLS and Unix sockets keep redis-py's own classes for them.
    assert _connection_class("rediss://example.com:6380/0") == {}
    assert _connection_class("unix:///run/redis.sock") == {}


async def test_a_redis_that_stops_answering_still_times_a_command_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-place write (shared/redis.py `_Connection`) keeps the reply's timeout: a
    server that answers the handshake and a PING, then nothing, fails the next command
    with a timeout instead of holding it forever."""
    silent = asyncio.Event()
    commands: list[list[bytes]] = []

    closed = asyncio.Event()  # the client hung up and the server's side is closed

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        parser = hiredis.Reader()
        try:
            while data := await reader.read(65536):
                parser.feed(data)
                while (command := parser.gets()) is not False:
                    commands.append(command)
                    if not silent.is_set():
                        writer.write(b"+PONG\r\n" if command[0].upper() == b"PING" else b"+OK\r\n")
        finally:
            writer.close()
            await writer.wait_closed()
            closed.set()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = aioredis.ConnectionPool(
        host="127.0.0.1", port=port, socket_timeout=0.3, connection_class=_Connection, protocol=2
    )
    client = aioredis.Redis(connection_pool=pool)
    waits: list[object] = []  # redis-py's writes under asyncio.wait_for (the way `_Connection` skips)
    wait_for = asyncio.wait_for

    async def counted(awaitable: Any, timeout: float | None) -> Any:
        waits.append(awaitable)
        return await wait_for(awaitable, timeout)

    monkeypatch.setattr(asyncio, "wait_for", counted)
    try:
        assert await client.ping()
        silent.set()
        before = len(waits)
        with pytest.raises(RedisTimeout):
            await client.set("k", "v")
        assert commands[-1] == [b"SET", b"k", b"v"]  # written, never answered
        assert len(waits) == before  # written in place, not in a task of its own
    finally:
        await client.aclose()
        await closed.wait()  # redis-py dropped the connection that timed out
        server.close()
        await server.wait_closed()
