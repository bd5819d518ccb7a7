"""The sink's script calls, gathered into one pipeline per loop turn (shared/batch.py), on a
real Redis: every reply's piece of a window goes in one round trip, and each caller still
gets its own answer, its own error, and a script Redis forgot is loaded again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError

from collab.chat import shared
from collab.chat.shared.base import ReplyEnded, StateLost
from collab.chat.shared.batch import ScriptBatch
from collab.chat.shared.redis import RedisState
from collab.chat.shared.redis_scripts import APPEND_PUBLISH
from tests.conftest import _use_layer, require_redis

pytestmark = pytest.mark.redis


@pytest.fixture
async def state(settings: Any) -> AsyncIterator[RedisState]:
    require_redis()
    _use_layer(settings, "redis")
    state = shared.backend()
    assert isinstance(state, RedisState)
    await state.redis.script_load(APPEND_PUBLISH)  # loaded, whatever test flushed the scripts before
    yield state
    await shared.reset()


class Sent(list[int]):
    """The size of every pipeline sent, in order; `in_flight`: those not answered yet."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight: list[int] = []


@pytest.fixture
def pipelines(monkeypatch: pytest.MonkeyPatch) -> Sent:
    """Every pipeline sent (the real one runs: this only counts)."""
    sent = Sent()
    execute = Pipeline.execute

    async def counted(self: Pipeline, raise_on_error: bool = True) -> Any:
        size = len(self.command_stack)
        sent.append(size)
        sent.in_flight.append(size)
        try:
            return await execute(self, raise_on_error)
        finally:
            sent.in_flight.remove(size)

    monkeypatch.setattr(Pipeline, "execute", counted)
    return sent


async def test_pieces_of_one_loop_turn_go_as_one_pipeline(state: RedisState, pipelines: Sent) -> None:
    for reply in range(1, 6):
        await state.begin(reply, 10, "p1")
    pipelines.clear()  # begin's own
    async with asyncio.timeout(10):
        await asyncio.gather(*(state.append_and_publish(r, f"piece {r}", 0, "", b"") for r in range(1, 6)))
    assert pipelines == [5]
    views = await state.read(list(range(1, 6)))
    assert {r: v.text for r, v in views.items()} == {r: f"piece {r}" for r in range(1, 6)}


async def test_calls_made_while_a_pipeline_is_in_flight_go_in_the_next(state: RedisState, pipelines: Sent) -> None:
    for reply in (1, 2, 3):
        await state.begin(reply, 10, "p1")
    pipelines.clear()
    overlaps: list[list[int]] = []
    first = asyncio.ensure_future(state.append_and_publish(1, "a", 0, "", b""))
    await asyncio.sleep(0)  # queued
    await asyncio.sleep(0)  # the sender runs: its pipeline is in flight
    overlaps.append(list(pipelines.in_flight))
    later = [asyncio.ensure_future(state.append_and_publish(r, "b", 0, "", b"")) for r in (2, 3)]
    async with asyncio.timeout(10):
        await asyncio.gather(first, *later)
    assert overlaps == [[1]]  # the first was in flight when the others came
    assert pipelines == [1, 2]  # and they went together, after it (one pipeline at a time)


async def test_each_caller_gets_its_own_answer(state: RedisState) -> None:
    """One pipeline; an ended reply, a lost record and a plain piece each answer their own caller."""
    for reply in (1, 2, 3):
        await state.begin(reply, 10, "p1")
    await state.end(1)
    await state.redis.delete(state._r(2) + ":t")  # as after a restart
    ended, lost, fine = await asyncio.gather(
        state.append_and_publish(1, "x", 0, "", b""),
        state.append_and_publish(2, "y", 0, "", b""),
        state.append_and_publish(3, "z", 0, "", b""),
        return_exceptions=True,
    )
    assert isinstance(ended, ReplyEnded)
    assert isinstance(lost, StateLost)
    assert fine is True
    assert (await state.read([3]))[3].text == "z"


async def test_a_script_redis_forgot_is_loaded_again(state: RedisState, pipelines: Sent) -> None:
    for reply in (1, 2):
        await state.begin(reply, 10, "p1")
    await state.redis.script_flush()  # as after a restart: every script is gone
    pipelines.clear()
    async with asyncio.timeout(10):
        await asyncio.gather(*(state.append_and_publish(r, "again", 0, "", b"") for r in (1, 2)))
    assert pipelines == [2, 2]  # NOSCRIPT for both, loaded, both sent again
    assert {r: v.text for r, v in (await state.read([1, 2])).items()} == {1: "again", 2: "again"}


async def script_exists_calls(state: RedisState) -> int:
    """How many SCRIPT EXISTS this Redis has answered (its command statistics)."""
    stats = await state.redis.info("commandstats")
    return int(stats.get("cmdstat_script|exists", {}).get("calls", 0))


async def test_a_reply_begins_in_one_round_trip_and_with_a_script_redis_forgot(
    state: RedisState, pipelines: Sent
) -> None:
    asked = await script_exists_calls(state)
    await state.begin(1, 10, "p1")
    assert pipelines == [6]  # its keys and its lease
    assert await script_exists_calls(state) == asked  # with no SCRIPT EXISTS first (a round trip)
    await state.redis.script_flush()  # as after a restart
    await state.begin(2, 10, "p1")
    leases = await state.redis.zrange(state.p + "leases", 0, -1)
    assert {int(r) for r in leases} >= {1, 2}  # the lease was loaded and taken
    assert (await state.read([2]))[2].text == ""


async def test_a_redis_that_is_away_fails_every_caller_of_the_batch() -> None:
    state = RedisState("redis://127.0.0.1:1/0", "t:")  # nothing listens there
    try:
        async with asyncio.timeout(10):
            results = await asyncio.gather(
                *(state.append_and_publish(r, "x", 0, "", b"") for r in (1, 2, 3)), return_exceptions=True
            )
        assert all(isinstance(r, RedisConnectionError) for r in results), results
        assert state._pieces._sender is None  # nothing left running: the next call starts afresh
    finally:
        await state.close()


async def test_a_caller_cancelled_while_queued_is_not_sent(state: RedisState, pipelines: Sent) -> None:
    for reply in (1, 2):
        await state.begin(reply, 10, "p1")
    pipelines.clear()
    gone = asyncio.ensure_future(state.append_and_publish(1, "x", 0, "", b""))
    kept = asyncio.ensure_future(state.append_and_publish(2, "y", 0, "", b""))
    await asyncio.sleep(0)  # both queued, the sender not yet run
    gone.cancel()
    async with asyncio.timeout(10):
        assert await kept is True
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert pipelines == [1]
    views = await state.read([1, 2])
    assert (views[1].text, views[2].text) == ("", "y")


async def test_a_sender_cancelled_before_it_ran_fails_its_callers_and_the_next_call_works(state: RedisState) -> None:
    """Its callers get an error of the shared state (the sink keeps the text, restores it
    later), never a hang, nor a cancellation of their own tasks."""
    await state.begin(1, 10, "p1")
    waiting = asyncio.ensure_future(state.append_and_publish(1, "x", 0, "", b""))
    await asyncio.sleep(0)  # queued: the sender task exists, not yet run
    sender = state._pieces._sender
    assert sender is not None
    sender.cancel()
    async with asyncio.timeout(10):
        with pytest.raises(RedisConnectionError):
            await waiting
        assert state._pieces._sender is None
        assert await state.append_and_publish(1, "x", 0, "", b"") is True  # a new sender
    assert (await state.read([1]))[1].text == "x"


async def test_the_batch_sends_the_script_it_was_given(state: RedisState) -> None:
    """A batch of another script: the same gathering, that script's answers."""
    script = state.redis.register_script("return ARGV[1] .. KEYS[1]")
    batch = ScriptBatch(state.redis, script)
    async with asyncio.timeout(10):
        answers = await asyncio.gather(*(batch([f"k{i}"], [f"v{i}"]) for i in range(3)))
    assert answers == [b"v0k0", b"v1k1", b"v2k2"]
