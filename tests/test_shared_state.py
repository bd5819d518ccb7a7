"""The shared state's promises about a live reply's record, on both backends (this
process's memory, and Redis): a reply that was ended is never written to or brought back,
a new reply never inherits an earlier one's record, and a record Redis lost is refused,
not silently restarted mid-text, until its owner restores it whole."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from collab.chat import shared
from collab.chat.shared.base import ReplyEnded, SharedState, StateLost
from collab.chat.shared.redis import RedisState
from tests.conftest import _use_layer, require_redis


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


async def test_memory_state_never_reports_a_restart(state: SharedState) -> None:
    """Leases are trusted only once the state has been up a lease period: Redis reports
    its own uptime; one process's memory lives exactly as long as its replies."""
    uptime = await state.uptime_s()
    if isinstance(state, RedisState):
        assert 0 <= uptime < float("inf")
    else:
        assert uptime == float("inf")
