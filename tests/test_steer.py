"""Steering a reply while it streams (docs/wire.md, "steer a reply"; issue 35, item 6): a
member's note ends the reply at a clean boundary, the marker goes into its text, and the
model is asked again with the answer so far and the note, in the same article. Over real
sockets (the consumer in-process) on every channel layer, against the real simulated
model, whose `{{hold}}` directive keeps the first request streaming until it is steered
(collab/simulator/directives.py). Two real Daphne processes: tests/test_steer_cluster.py;
a real browser: tests/browser/test_steer_page.py."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.utils import timezone

from collab.chat import shared
from collab.chat.commands.registry import act
from collab.chat.errors import ClientError
from collab.chat.generation import LiveReply, ReplyJob, registry
from collab.chat.models import Membership, Message, Provider, Room
from collab.chat.replies import steering
from collab.chat.replies.steering import MAX_NOTE_CHARS, MAX_STEERS, PROMPT
from collab.chat.steer import GRACE_CHARS, MARK
from collab.llm.pool import ProviderConfig
from collab.simulator.text import simulated_tokens, thinking_tokens
from tests.conftest import SIM_TOKENS, Member, World, member, reply_ids
from tests.test_reasoning import exported

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("layer", "replies_idle")]

NOTE = "shorter, and in French"


def status(m: Member, reply_id: int) -> str:
    r = m.frames.replies.get(reply_id)
    return r.final_attrs.get("data-status", "") if r is not None else ""


def text(m: Member, reply_id: int) -> str:
    r = m.frames.replies.get(reply_id)
    return r.text if r is not None else ""


def line(by: str, note: str) -> str:
    return f"{MARK}{by}: {note}"


async def holding(alice: Member, question: str = "@a {{hold}} tell me about boats") -> int:
    """Alice asks; the reply streams (held) and its first piece has come. Its id."""
    await alice.post(question)
    await alice.until(lambda f: len(reply_ids(f)) == 1 and f.replies[reply_ids(f)[0]].pieces >= 1)
    return reply_ids(alice.frames)[0]


def request_with(app: Any, content: str) -> dict[str, Any]:
    """The latest request the simulated model got whose last message is `content` (the
    simulator is the session's: earlier tests asked it too)."""
    return [r for r in app.recorded if r["messages"][-1]["content"] == content][-1]


async def refused(m: Member, code: str, **frame: Any) -> None:
    before = len(m.frames.errors)
    await m.send(**frame)
    await m.until(lambda f: len(f.errors) > before)
    assert m.frames.errors[-1][0] == code, m.frames.errors[-1]


async def test_a_member_steers_a_streaming_reply_and_everyone_sees_it(world: World, sim: tuple[str, Any]) -> None:
    app = sim[1]
    async with member(world.alice) as alice, member(world.bob) as bob:
        reply_id = await holding(alice)
        await bob.until(lambda f: f.replies.get(reply_id) is not None and f.replies[reply_id].pieces >= 1)
        seen = len(text(bob, reply_id))
        await bob.send(action="steer", message_id=reply_id, text="  shorter,\n and   in French ")  # one line
        for m in (alice, bob):
            await m.until(lambda f, m=m: status(m, reply_id) == "done")
    stored = await Message.objects.aget(pk=reply_id)
    mark = "\n\n" + line("bob", NOTE) + "\n\n"
    assert stored.status == "done" and stored.text.count(mark) == 1, stored.text
    before, after = stored.text.split(mark)
    # The model was asked again: the first request, the answer so far as its own turn, the note.
    first = request_with(app, "alice: @a {{hold}} tell me about boats")
    second = request_with(app, PROMPT.format(by="bob", note=NOTE))
    assert second["messages"] == [*first["messages"], {"role": "assistant", "content": before}, second["messages"][-1]]
    # The answer ended at a boundary of the held text: a sentence's or a line's end (or,
    # past GRACE_CHARS, a word's), never within a word; the rest is the second answer, whole.
    held = "".join(simulated_tokens(first["messages"], 1, "sim", 20_000))
    assert held.startswith(before) and len(before) >= seen and held[len(before)].isspace()
    assert re.search(r"[.!?]$", before) or held[len(before)] == "\n" or len(before) > seen + GRACE_CHARS
    assert after == "".join(simulated_tokens(second["messages"], 1, "sim", SIM_TOKENS))
    # Everyone saw it live, in the same article: every piece once, the marker among them.
    for m in (alice, bob):
        r = m.frames.replies[reply_id]
        assert r.text == stored.text and r.lost == 0 and r.duplicated == 0
        assert f'<span class="steer-mark">{line("bob", NOTE)}</span>' in r.final_html
    assert await Message.objects.filter(room=world.room, role="assistant").acount() == 1
    assert stored.tokens is not None and stored.tokens > SIM_TOKENS  # both requests' tokens
    assert line("bob", NOTE) in await exported(world.alice, "md")
    async with member(world.bob) as again:  # after it: the snapshot holds the marker
        assert f'<span class="steer-mark">{line("bob", NOTE)}</span>' in again.raw[0]


async def test_a_reconnect_mid_steer_resumes_the_whole_text(world: World) -> None:
    """A page that connects while the steered reply goes on gets the text so far, the
    marker in it, and every piece after it once; so does one after it ended."""
    async with member(world.alice) as alice, member(world.bob) as bob:
        reply_id = await holding(alice)
        await bob.send(action="steer", message_id=reply_id, text="{{hold}} slower")  # the second request holds too
        mark = line("bob", "{{hold}} slower") + "\n\n"
        await alice.until(lambda f: mark in text(alice, reply_id) and not text(alice, reply_id).endswith(mark))
        async with member(world.bob) as late:
            assert mark in text(late, reply_id)  # from the snapshot
            length = len(text(late, reply_id))
            await late.until(lambda f: len(text(late, reply_id)) > length)  # and pieces after it
            await alice.send(action="stop", message_id=reply_id)
            for m in (alice, bob, late):
                await m.until(lambda f, m=m: status(m, reply_id) == "stopped")
    stored = await Message.objects.aget(pk=reply_id)
    assert stored.status == "stopped" and mark in stored.text
    for m in (alice, bob, late):
        r = m.frames.replies[reply_id]
        assert r.text == stored.text and r.lost == 0 and r.duplicated == 0


async def test_a_steer_before_the_first_word_restarts_the_request(world: World, sim: tuple[str, Any]) -> None:
    """No answer yet (its model silent): the request is ended at once; the marker opens
    the text and the model gets no empty turn of its own."""
    app = sim[1]
    async with member(world.alice) as alice:
        await alice.post("@a {{fault stall@0}} wait for it")
        await alice.until(lambda f: len(reply_ids(f)) == 1)
        [reply_id] = reply_ids(alice.frames)
        await alice.send(action="steer", message_id=reply_id, text="be brief")
        await alice.until(lambda f: status(alice, reply_id) == "done")
    stored = await Message.objects.aget(pk=reply_id)
    second = request_with(app, PROMPT.format(by="alice", note="be brief"))
    assert second["messages"][-2]["content"] == "alice: @a {{fault stall@0}} wait for it"
    assert stored.text == line("alice", "be brief") + "\n\n" + "".join(
        simulated_tokens(second["messages"], 1, "sim", SIM_TOKENS)
    )
    assert text(alice, reply_id) == stored.text


async def test_a_model_that_stalls_mid_sentence_is_cut_where_it_stands(world: World, sim: tuple[str, Any]) -> None:
    """No boundary comes (the model went silent mid-sentence): WAIT_S after the note, the
    request is ended as it stands and the reply goes on."""
    await Provider.objects.filter(pk=world.provider.pk).aupdate(read_timeout_s=60)  # the model's silence: no failure
    async with member(world.alice) as alice:
        reply_id = await holding(alice, "@a {{fault stall@5}} five tokens then silence")
        asked = request_with(sim[1], "alice: @a {{fault stall@5}} five tokens then silence")
        so_far = "".join(simulated_tokens(asked["messages"], 1, "sim", SIM_TOKENS)[:5])
        await alice.until(lambda f: f.replies[reply_id].text == so_far)  # all it sends before its silence
        await alice.send(action="steer", message_id=reply_id, text="go on")
        await alice.until(lambda f: status(alice, reply_id) == "done", timeout=30)
    stored = await Message.objects.aget(pk=reply_id)
    assert stored.text.startswith(so_far + "\n\n" + line("alice", "go on") + "\n\n")


async def test_a_failed_second_request_ends_the_reply_with_its_text(world: World) -> None:
    """Whatever fails after a steer, the reply ends with a final status and its text."""
    async with member(world.alice) as alice, member(world.bob) as bob:
        reply_id = await holding(alice)
        await bob.send(action="steer", message_id=reply_id, text="in French {{fault quota}}")
        for m in (alice, bob):
            await m.until(lambda f, m=m: status(m, reply_id) == "failed")
        first = await Message.objects.aget(pk=reply_id)
        await alice.post("@a {{hold}} and again")
        await alice.until(lambda f: len(reply_ids(f)) == 2 and f.replies[max(reply_ids(f))].pieces >= 1)
        dropped = max(reply_ids(alice.frames))
        await bob.send(action="steer", message_id=dropped, text="three words {{fault drop@3}}")
        await alice.until(lambda f: status(alice, dropped) == "failed")
    mark = "\n\n" + line("bob", "in French {{fault quota}}") + "\n\n"
    assert first.text.endswith(mark) and first.error  # the text so far, the marker last, the reason
    for m in (alice, bob):
        assert m.frames.replies[reply_id].text == first.text
    second = await Message.objects.aget(pk=dropped)
    before, after = second.text.split("\n\n" + line("bob", "three words {{fault drop@3}}") + "\n\n")
    assert before and len(re.findall(r"\S+", after)) >= 1 and second.status == "failed"
    assert text(alice, dropped) == second.text


async def test_steering_is_refused_when_it_may_not(world: World, sim: tuple[str, Any]) -> None:
    app = sim[1]

    def rows() -> dict[str, int]:
        other = Room.objects.create(name="Other", slug="other", owner=world.carol)
        Membership.objects.create(room=other, user=world.carol, role=Membership.Role.OWNER)
        q = Message.objects.create(room=other, seq=1, role="user", author=world.carol, author_name="carol", text="q")
        made = {"question": q.pk}
        made["foreign"] = Message.objects.create(
            room=other, seq=2, role="assistant", assistant=world.assistants["a"], author_name="A", reply_to=q,
            status="streaming",
        ).pk  # fmt: skip
        mine = Message.objects.create(room=world.room, seq=50, role="user", author=world.alice, author_name="alice")
        made["mine"] = mine.pk
        made["personal"] = Message.objects.create(  # alice's own personal reply: not bob's to see
            room=world.room, seq=51, role="assistant", assistant=world.assistants["a"], author_name="A",
            reply_to=mine, recipient=world.alice, status="streaming",
        ).pk  # fmt: skip
        made["agent"] = Message.objects.create(
            room=world.room, seq=52, role="assistant", assistant=world.assistants["a"], author_name="A",
            reply_to=mine, status="streaming", agent_steps=0,
        ).pk  # fmt: skip
        made["orphan"] = Message.objects.create(  # streaming, but no process runs it
            room=world.room, seq=54, role="assistant", assistant=world.assistants["a"], author_name="A",
            reply_to=mine, status="streaming",
        ).pk  # fmt: skip
        made["ended"] = Message.objects.create(
            room=world.room, seq=53, role="assistant", assistant=world.assistants["a"], author_name="A",
            reply_to=mine, status="done", text="done already", finished_at=timezone.now(),
        ).pk  # fmt: skip
        return made

    made = await database_sync_to_async(rows)()
    requests = len(app.recorded)
    async with member(world.bob) as bob:
        ended, agent = made["ended"], made["agent"]
        await refused(bob, "steer.not_streaming", action="steer", message_id=ended, text=NOTE)
        await refused(bob, "steer.agent", action="steer", message_id=agent, text=NOTE)
        await refused(bob, "message.not_found", action="steer", message_id=made["foreign"], text=NOTE)
        await refused(bob, "message.not_found", action="steer", message_id=made["personal"], text=NOTE)
        await refused(bob, "message.not_found", action="steer", message_id=made["mine"], text=NOTE)  # not a reply
        await refused(bob, "message.invalid_id", action="steer", message_id="7; drop", text=NOTE)
        await refused(bob, "steer.empty", action="steer", message_id=ended, text=" \n\t ")
        await refused(bob, "steer.empty", action="steer", message_id=ended)
        await refused(bob, "steer.too_long", action="steer", message_id=ended, text="x" * (MAX_NOTE_CHARS + 1))
        await refused(bob, "steer.invalid", action="steer", message_id=ended, text=["a list"])
        await refused(bob, "steer.invalid", action="steer", message_id=ended, text="nul\x00")
        # A lone surrogate (JSON's "\ud800") could not be stored or sent; an override would
        # make the marker read otherwise than it does.
        for bad in ("half \ud800 a pair", "bell\x07", "mirror \u202e kcab"):
            await refused(bob, "steer.invalid", action="steer", message_id=ended, text=bad)
        await Room.objects.filter(pk=world.room.pk).aupdate(status=Room.Status.LOCKED)
        await refused(bob, "room.locked", action="steer", message_id=agent, text=NOTE)
        await Room.objects.filter(pk=world.room.pk).aupdate(status=Room.Status.OPEN, budget_tokens=1)
        await Message.objects.filter(pk=ended).aupdate(tokens=5)  # the room's budget: spent
        await refused(bob, "room.budget", action="steer", message_id=made["orphan"], text=NOTE)
        await Room.objects.filter(pk=world.room.pk).aupdate(budget_tokens=None)
    # A non-member (no socket of hers would open: the same checks, without one).
    with pytest.raises(ClientError) as outsider:
        await act(world.carol.pk, world.room.pk, "steer", message_id=agent, text=NOTE)
    assert outsider.value.code == "room.forbidden"
    assert len(app.recorded) == requests  # no model was asked
    assert (await Message.objects.aget(pk=ended)).text == "done already"


async def test_a_reply_takes_at_most_max_steers(world: World) -> None:
    async with member(world.alice) as alice:
        reply_id = await holding(alice)
        for _ in range(MAX_STEERS):  # the reply's notes, used up elsewhere (the bucket is the deployment's)
            assert await shared.backend().take(f"steer:{reply_id}", float(MAX_STEERS), 86_400.0)
        await refused(alice, "steer.too_many", action="steer", message_id=reply_id, text=NOTE)
        await alice.send(action="stop", message_id=reply_id)
        await alice.until(lambda f: status(alice, reply_id) == "stopped")
    assert line("alice", NOTE) not in (await Message.objects.aget(pk=reply_id)).text


async def test_a_streaming_reply_without_a_process_is_not_steered(world: World) -> None:
    """Its process died (no lease): the sweep will end it; a note has nowhere to go."""

    def orphan() -> int:
        q = Message.objects.create(room=world.room, seq=1, role="user", author=world.alice, author_name="alice")
        return Message.objects.create(
            room=world.room, seq=2, role="assistant", assistant=world.assistants["a"], author_name="A",
            reply_to=q, status="streaming", text="half",
        ).pk  # fmt: skip

    reply_id = await database_sync_to_async(orphan)()
    with pytest.raises(ClientError) as refusal:
        await act(world.bob.pk, world.room.pk, "steer", message_id=reply_id, text=NOTE)
    assert refusal.value.code == "steer.not_streaming"


async def test_a_reply_steered_while_it_thinks_keeps_its_thinking(world: World, sim: tuple[str, Any]) -> None:
    """A reasoning model steered before its answer: the request ends at once; its thinking
    so far stays (the next request's follows it), the marker opens the answer."""
    assistant = world.assistants["a"]
    assistant.model = "sim+think@300"  # within its max_tokens (500) with the answer: 15 s of held thinking
    await database_sync_to_async(assistant.save)()
    async with member(world.alice) as alice:
        await alice.post("@a {{hold}} think first")
        await alice.until(lambda f: len(reply_ids(f)) == 1)
        [reply_id] = reply_ids(alice.frames)
        await alice.until(lambda f: any(f'id="msg-{reply_id}-thinking" hx-swap-oob' in r for r in alice.raw))
        await alice.send(action="steer", message_id=reply_id, text="answer now")
        await alice.until(lambda f: status(alice, reply_id) == "done", timeout=30)
    stored = await Message.objects.aget(pk=reply_id)
    assert stored.text.startswith(line("alice", "answer now") + "\n\n") and len(stored.text) > 40
    assert text(alice, reply_id) == stored.text
    first = request_with(sim[1], "alice: @a {{hold}} think first")
    second = request_with(sim[1], PROMPT.format(by="alice", note="answer now"))
    assert second["messages"][:-1] == first["messages"]  # no answer yet: no turn of its own
    thought = "".join(thinking_tokens(first["messages"], 1, "sim", 300))
    again = "".join(thinking_tokens(second["messages"], 1, "sim", 300))
    before = stored.reasoning.removesuffix(again)  # the first request's thinking, then the second's
    assert before and thought.startswith(before) and stored.reasoning == before + again


async def test_a_personal_reply_is_steered_by_its_recipient_alone(world: World) -> None:
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.send(action="lens", text="answer me in Spanish")
        await alice.until(lambda f: any('data-lens="answer me in Spanish"' in r for r in alice.raw))
        await alice.post("/each @a {{hold}} how do we ship?")
        await alice.until(lambda f: any(r.role == "assistant" and r.pieces >= 1 for r in f.replies.values()))
        [reply_id] = reply_ids(alice.frames)
        await refused(bob, "message.not_found", action="steer", message_id=reply_id, text=NOTE)  # not his to see
        await alice.send(action="steer", message_id=reply_id, text=NOTE)
        await alice.until(lambda f: status(alice, reply_id) == "done")
        await bob.assert_silent()
    stored = await Message.objects.aget(pk=reply_id)
    assert stored.recipient_id == world.alice.pk and line("alice", NOTE) in stored.text
    assert text(alice, reply_id) == stored.text and reply_id not in bob.frames.replies


async def test_a_note_that_reaches_its_reply_as_it_ends_is_answered_from_there(world: World) -> None:
    """On the reply's own process (a `reply.steer` event from another's socket), a reply
    already storing its end takes no note: the member's socket is told, from there."""
    job = ReplyJob(999_999, world.room.pk, ProviderConfig("sim", ("http://127.0.0.1:9",)), "sim", [], None, None)
    live = LiveReply(job, sink=None)  # type: ignore[arg-type]  # never run: only its state is read
    live.task, live.finishing = asyncio.get_running_loop().create_future(), True  # type: ignore[assignment]
    registry._live[job.message_id] = live
    layer = get_channel_layer()
    assert layer is not None
    channel = await layer.new_channel()
    try:
        event = {"type": "reply.steer", "message_id": job.message_id, "by": "bob", "text": NOTE, "channel": channel}
        await steering.on_control(event)  # type: ignore[arg-type]
        told = await asyncio.wait_for(layer.receive(channel), 10)
    finally:
        registry._live.pop(job.message_id, None)
        live.task.cancel()
    assert told["type"] == "room.frame" and 'data-code="steer.not_streaming"' in told["html"]
    assert live.steer is None
