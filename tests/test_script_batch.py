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
from tests.conftest import _use_layer, require_redis

pytestmark = pytest.mark.redis


@pytest.fixture
async def state(settings: Any) -> AsyncIterator[RedisState]:
    require_redis()
    _use_layer(settings, "redis")
    state = shared.backend()
    assert isinstance(state, RedisState)
    yield state
    await shared.reset()


@pytest.fixture
def pipelines(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every pipeline sent (the real one runs: this only counts)."""
    sizes: list[int] = []
    execute = Pipeline.execute

    async def counted(self: Pipeline, raise_on_error: bool = True) -> Any:
        sizes.append(len(self.command_stack))
        return await execute(self, raise_on_error)

    monkeypatch.setattr(Pipeline, "execute", counted)
    return sizes


async def test_pieces_of_one_loop_turn_go_as_one_pipeline(state: RedisState, pipelines: list[int]) -> None:
    for reply in range(1, 6):
        await state.begin(reply, 10, "p1")
    pipelines.clear()  # begin's own
    await asyncio.gather(*(state.append_and_publish(r, f"piece {r}", 0, "", b"") for r in range(1, 6)))
    assert pipelines == [5]
    views = await state.read(list(range(1, 6)))
    assert {r: v.text for r, v in views.items()} == {r: f"piece {r}" for r in range(1, 6)}


async def test_calls_made_while_a_pipeline_is_in_flight_go_in_the_next(state: RedisState, pipelines: list[int]) -> None:
    for reply in (1, 2, 3):
        await state.begin(reply, 10, "p1")
    pipelines.clear()
    first = asyncio.ensure_future(state.append_and_publish(1, "a", 0, "", b""))
    await asyncio.sleep(0)  # queued
    await asyncio.sleep(0)  # the sender runs: its pipeline is in flight
    later = [asyncio.ensure_future(state.append_and_publish(r, "b", 0, "", b"")) for r in (2, 3)]
    await asyncio.gather(first, *later)
    assert pipelines == [1, 2]


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


async def test_a_script_redis_forgot_is_loaded_again(state: RedisState, pipelines: list[int]) -> None:
    for reply in (1, 2):
        await state.begin(reply, 10, "p1")
    await state.redis.script_flush()  # as after a restart: every script is gone
    pipelines.clear()
    await asyncio.gather(*(state.append_and_publish(r, "again", 0, "", b"") for r in (1, 2)))
    assert pipelines == [2, 2]  # NOSCRIPT for both, loaded, both sent again
    assert {r: v.text for r, v in (await state.read([1, 2])).items()} == {1: "again", 2: "again"}


async def test_a_redis_that_is_away_fails_every_caller_of_the_batch() -> None:
    state = RedisState("redis://127.0.0.1:1/0", "t:")  # nothing listens there
    try:
        results = await asyncio.gather(
            *(state.append_and_publish(r, "x", 0, "", b"") for r in (1, 2, 3)), return_exceptions=True
        )
        assert all(isinstance(r, RedisConnectionError) for r in results), results
        assert state._pieces._sender is None  # nothing left running: the next call starts afresh
    finally:
        await state.close()


async def test_a_cancelled_caller_does_not_disturb_the_others(state: RedisState) -> None:
    for reply in (1, 2):
        await state.begin(reply, 10, "p1")
    gone = asyncio.ensure_future(state.append_and_publish(1, "x", 0, "", b""))
    kept = asyncio.ensure_future(state.append_and_publish(2, "y", 0, "", b""))
    await asyncio.sleep(0)  # both queued
    gone.cancel()
    assert await kept is True
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert (await state.read([2]))[2].text == "y"


async def test_the_batch_sends_the_script_it_was_given(state: RedisState) -> None:
    """A batch of another script: the same gathering, that script's answers."""
    script = state.redis.register_script("return ARGV[1] .. KEYS[1]")
    batch = ScriptBatch(state.redis, script)
    answers = await asyncio.gather(*(batch([f"k{i}"], [f"v{i}"]) for i in range(3)))
    assert answers == [b"v0k0", b"v1k1", b"v2k2"]
