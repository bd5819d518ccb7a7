"""The first token off the storage path (issue 9, lever 2; chat/replies/early.py): a question's
model request is sent before the question is stored, from what this process knows of
the room, and taken by its reply only if it is the very request the stored context
makes. Against the simulated model, through the real openai client."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
from channels.db import database_sync_to_async
from prometheus_client import REGISTRY

from collab.chat import broadcast
from collab.chat.generation import Outcome, ReplyJob, registry
from collab.chat.models import Assistant, Message, Room
from collab.chat.replies import early
from collab.llm import early_request as llm_early
from collab.llm.client import Endpoint, request_body, stream_chat
from collab.llm.early_request import EarlyRequest
from collab.llm.pool import ProviderConfig, first_url, pool_for, stream_reply
from tests.conftest import Member, World, all_final, member

pytestmark = pytest.mark.usefixtures("replies_idle", "memory_layer")


def count(outcome: str) -> float:
    return REGISTRY.get_sample_value("collab_early_requests_total", {"outcome": outcome}) or 0.0


def sent_with(sim: tuple[str, Any], needle: str) -> list[str]:
    """The requests the model received whose messages hold `needle`."""
    return [str(r["messages"]) for r in list(sim[1].recorded) if needle in str(r["messages"])]


async def until_sent(sim: tuple[str, Any], needle: str, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        # The simulator serves from its own thread: its record is a plain list, polled.
        while not sent_with(sim, needle):  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def ask(m: Member, text: str, n: int = 1) -> None:
    """Post `text` and wait until its `n` replies have ended, and with them their tasks
    (a reply's request is counted as its task ends)."""
    before = len([r for r in m.frames.replies.values() if r.role == "assistant" and r.final_attrs])
    await m.post(text)
    await m.until(lambda f: all_final(f, before + n))
    async with asyncio.timeout(10):
        await registry.wait_idle()


async def test_a_question_reaches_the_model_while_the_database_is_busy(world: World, sim: tuple[str, Any]) -> None:
    async with member(world.alice) as alice:
        await ask(alice, "@a first, to read the room")
        await alice.post("no question, just chatter")  # stored here: the room stays known
        await alice.until(lambda f: sum(r.role == "user" for r in f.replies.values()) == 2)
        assert early.known(world.room.id) is not None
        taken, wasted = count("taken"), count("wasted")
        tag = uuid.uuid4().hex
        release = threading.Event()
        # The database thread (store_post's) waits on `release`: nothing can be stored meanwhile.
        busy = asyncio.ensure_future(database_sync_to_async(release.wait)(20))
        try:
            await alice.post(f"@a second {tag}")
            await until_sent(sim, tag)
            assert not busy.done()  # the request went out before the question could be stored
        finally:
            release.set()
            await busy
        await alice.until(lambda f: all_final(f, 2))
        async with asyncio.timeout(10):
            await registry.wait_idle()
        assert len(sent_with(sim, tag)) == 1  # taken by its reply: not sent again
        assert (count("taken"), count("wasted")) == (taken + 1, wasted)
        sent = sent_with(sim, tag)[0]
        assert "just chatter" in sent and "first, to read the room" in sent  # the chatter, and the first reply's
    reply = await Message.objects.filter(role="assistant").order_by("-seq").afirst()
    assert reply is not None and reply.status == "done" and reply.text and reply.ttft_ms is not None


async def test_a_guess_that_the_stored_context_contradicts_is_cancelled(world: World, sim: tuple[str, Any]) -> None:
    async with member(world.alice) as alice:
        await ask(alice, "@a first")
        # Changed behind the app's back (no frame, no signal): this process's guess is stale.
        await Room.objects.filter(pk=world.room.pk).aupdate(topic="a topic nobody announced")
        taken, wasted = count("taken"), count("wasted")
        tag = uuid.uuid4().hex
        await ask(alice, f"@a second {tag}")
        sent = sent_with(sim, tag)
        assert len(sent) == 2  # the guess, then the request the stored room makes
        assert "about: testing" in sent[0] and "a topic nobody announced" in sent[1]
        assert (count("taken"), count("wasted")) == (taken, wasted + 1)
        # Read again with that post: the next question is guessed right.
        tag = uuid.uuid4().hex
        await ask(alice, f"@a third {tag}")
        assert len(sent_with(sim, tag)) == 1 and count("taken") == taken + 1
    reply = await Message.objects.filter(role="assistant").order_by("-seq").afirst()
    assert reply is not None and reply.status == "done"


async def test_a_frame_it_did_not_expect_means_no_guess(world: World, sim: tuple[str, Any]) -> None:
    async with member(world.alice) as alice:
        await ask(alice, "@a first")
        assert early.known(world.room.id) is not None
        # What another process's post looks like here: a "new" frame this process did not send.
        await broadcast.to_room(world.room.id, {"type": "room.frame", "kind": "new", "msg": 10**9, "html": ""})
        await alice.until(lambda f: early.known(world.room.id) is None)
        taken, wasted = count("taken"), count("wasted")
        tag = uuid.uuid4().hex
        await ask(alice, f"@a second {tag}")
        assert len(sent_with(sim, tag)) == 1 and (count("taken"), count("wasted")) == (taken, wasted)
        assert early.known(world.room.id) is not None  # that post read it again


async def test_a_question_that_is_not_stored_cancels_its_request_and_the_sender_is_told(
    world: World, sim: tuple[str, Any]
) -> None:
    async with member(world.alice) as alice:
        await ask(alice, "@a first")
        await Room.objects.filter(pk=world.room.pk).aupdate(status=Room.Status.LOCKED)  # no frame: still guessed
        wasted = count("wasted")
        tag = uuid.uuid4().hex
        await alice.post(f"@a refused {tag}")
        await alice.until(lambda f: "room.locked" in "".join(alice.raw))
        assert count("wasted") == wasted + 1
        assert not await Message.objects.filter(text__contains=tag).aexists()


async def test_a_change_to_an_assistant_forgets_the_rooms(world: World) -> None:
    async with member(world.alice) as alice:
        await ask(alice, "@a first")
        assert early.known(world.room.id) is not None
        assistant = await Assistant.objects.aget(handle="a")
        assistant.system_prompt = "Answer in verse."
        await assistant.asave()
        assert early.known(world.room.id) is None


async def test_guessing_can_be_turned_off(world: World, sim: tuple[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLLAB_EARLY_REQUESTS", "0")
    async with member(world.alice) as alice:
        await ask(alice, "@a first")
        taken, wasted = count("taken"), count("wasted")
        await ask(alice, "@a second")
        assert (count("taken"), count("wasted")) == (taken, wasted)


# --- the request itself (llm/early_request.py) ------------------------------------------------------------


async def test_stream_chat_takes_a_request_that_fits_and_cancels_one_that_does_not(sim: tuple[str, Any]) -> None:
    endpoint = Endpoint(base_url=sim[0], read_timeout_s=5)
    tag = uuid.uuid4().hex
    messages = [{"role": "user", "content": f"hello {tag}"}]
    fits = EarlyRequest(endpoint, request_body("sim", messages, None, 50))
    text = "".join(
        [
            p
            async for ps in stream_chat(endpoint, "sim", messages, max_tokens=50, early=fits)
            for p in ps
            if isinstance(p, str)
        ]
    )
    assert text and fits.taken and len(sent_with(sim, tag)) == 1
    other = uuid.uuid4().hex
    stale = EarlyRequest(endpoint, request_body("sim", [{"role": "user", "content": f"stale {other}"}], None, 50))
    fresh = [{"role": "user", "content": f"fresh {other}"}]
    text = "".join(
        [
            p
            async for ps in stream_chat(endpoint, "sim", fresh, max_tokens=50, early=stale)
            for p in ps
            if isinstance(p, str)
        ]
    )
    assert text and stale.taken and any(f"fresh {other}" in s for s in sent_with(sim, other))
    async with asyncio.timeout(10):  # cancelled, or answered first and then closed
        while not stale.closed:  # noqa: ASYNC110 (its close is a task of its own, not awaitable here)
            await asyncio.sleep(0.005)


async def test_a_reply_stopped_before_it_ran_ends_stopped_and_gives_its_request_up(sim: tuple[str, Any]) -> None:
    config = ProviderConfig(name=f"p-{uuid.uuid4().hex}", base_urls=(sim[0],), read_timeout_s=5)
    tag = uuid.uuid4().hex
    messages: list[Any] = [{"role": "user", "content": f"never read {tag}"}]
    request = EarlyRequest(config.endpoint(sim[0]), request_body("sim", messages, None, 50))
    job = ReplyJob(10**9, 10**9, config, "sim", messages, None, 50, early=request)
    wasted = count("wasted")

    class Kept:  # where the reply goes: only its end
        def __init__(self) -> None:
            self.outcomes: list[Outcome] = []

        async def piece(self, offset: int, text: str) -> None: ...
        async def thought(self, offset: int, text: str) -> None: ...
        async def state(self, text: str) -> None: ...
        async def finish(self, outcome: Outcome) -> None:
            self.outcomes.append(outcome)

    kept = Kept()
    live = registry.start(job, kept)
    assert registry.stop(job.message_id)  # before the task's first step
    assert live.task is not None
    async with asyncio.timeout(10):
        await live.task
        await registry.wait_idle()
        await asyncio.gather(*llm_early._closing)
    assert [o.status for o in kept.outcomes] == ["stopped"]  # it ends, as stopped, with its text
    assert request.closed and not request.used and count("wasted") == wasted + 1


async def test_a_reply_cancelled_as_its_response_arrives_closes_it(sim: tuple[str, Any]) -> None:
    endpoint = Endpoint(base_url=sim[0], read_timeout_s=5)
    tag = uuid.uuid4().hex
    request = EarlyRequest(endpoint, request_body("sim", [{"role": "user", "content": f"hi {tag}"}], None, 50))
    waiting: asyncio.Task[Any] = asyncio.get_running_loop().create_task(request.response())
    # Cancelled by the callback that runs as the response arrives, before `response` resumes:
    # it then holds an open response that nobody else will close.
    request._task.add_done_callback(lambda _t: waiting.cancel())
    await asyncio.sleep(0)  # `waiting` runs to its await (registered after the callback above)
    with pytest.raises(asyncio.CancelledError):
        await waiting
    async with asyncio.timeout(10):
        await asyncio.gather(*llm_early._closing)
    assert request._task.done() and not request._task.cancelled()  # it was answered
    assert request.closed  # and its response closed


async def test_the_endpoint_a_request_was_sent_to_is_tried_first(sim: tuple[str, Any]) -> None:
    other = sim[0].replace("127.0.0.1", "localhost")  # the same model under another address
    config = ProviderConfig(name=f"p-{uuid.uuid4().hex}", base_urls=(sim[0], other), read_timeout_s=5)
    pool = pool_for(config)
    pool.endpoints[0].in_flight = 1  # busy when the request is sent: it goes to the other
    assert first_url(config) == other
    tag = uuid.uuid4().hex
    messages: list[Any] = [{"role": "user", "content": f"two endpoints {tag}"}]
    request = EarlyRequest(config.endpoint(other), request_body("sim", messages, None, 50))
    await until_sent(sim, tag)
    pool.endpoints[0].in_flight = 0  # free again when the reply starts: still the other first
    text = [
        p
        async for ps in stream_reply(config, "sim", messages, max_tokens=50, early=request)
        for p in ps
        if isinstance(p, str)
    ]
    assert text and request.used and len(sent_with(sim, tag)) == 1
    # A pool running another configuration is not read as this one's, nor changed by it.
    changed = ProviderConfig(name=config.name, base_urls=(sim[0],), read_timeout_s=5)
    assert first_url(changed) is None and pool.config == config


async def test_nothing_is_known_while_the_channel_layer_is_away(world: World) -> None:
    from collab.chat.lifecycle import runtime

    async with member(world.alice) as alice:
        await ask(alice, "@a first")
        assert early.known(world.room.id) is not None
        runtime.stale = True  # as when a hub's receive or the heartbeat failed: frames may be lost
        try:
            assert early.known(world.room.id) is None
            await ask(alice, "@a second")  # read the stored way, and not remembered
            assert early.known(world.room.id) is None
        finally:
            runtime.stale = False  # the process's own ping came back
        await ask(alice, "@a third")
        assert early.known(world.room.id) is not None


async def test_a_guess_that_fails_partway_gives_up_what_it_sent(
    world: World, sim: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with member(world.alice) as alice:
        await ask(alice, "@a first")
        known = early.known(world.room.id)  # while a socket holds the room
    assert known is not None and len(known.assistants) == 2
    built = early.build_context

    def second_fails(assistant: Assistant, *args: Any) -> Any:
        if assistant.handle == "b":
            raise RuntimeError("a bug in building b's context")
        return built(assistant, *args)

    monkeypatch.setattr(early, "build_context", second_fails)
    wasted = count("wasted")
    sent: list[EarlyRequest] = []
    monkeypatch.setattr(early, "EarlyRequest", lambda *a: sent.append(EarlyRequest(*a)) or sent[-1])
    with pytest.raises(RuntimeError):
        early.guess(known, list(known.assistants), "alice", "@all both")
    assert len(sent) == 1 and sent[0].taken and count("wasted") == wasted + 1  # a's, given up
    async with asyncio.timeout(10):
        while not sent[0].closed:  # noqa: ASYNC110 (cancelled, or answered and then closed by a task of its own)
            await asyncio.sleep(0.005)
