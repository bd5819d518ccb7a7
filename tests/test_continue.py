"""Honest endings (issue 11, part 7): a reply cut off at max_tokens ends `done` with
`data-finish="length"`, a visible mark and a Continue button; `{"action": "continue"}`
makes the same reply stream on from where it stopped, for every member, and is refused
(with its code, changing nothing) when it may not."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from collab.chat.models import Membership, Message, Room
from collab.chat.replies.continuation import CONTINUE_PROMPT
from tests.conftest import SIM_TOKENS, Member, World, member, reply_ids, stalling
from tests.test_reasoning import exported

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("layer", "replies_idle")]

CUT = 10  # the assistant's max_tokens: every reply of SIM_TOKENS (60) is cut off


def final_status(m: Member, reply_id: int) -> str:
    r = m.frames.replies.get(reply_id)
    return r.final_attrs.get("data-status", "") if r is not None else ""


def final_frames(m: Member, reply_id: int) -> list[str]:
    return [f for f in m.raw if f'<article id="msg-{reply_id}"' in f and 'hx-swap-oob="true"' in f]


async def cut_off_reply(world: World, alice: Member, question: str = "@a tell me everything") -> int:
    """Alice asks; the reply ends cut off. Its id."""
    await alice.post(question)
    await alice.until(lambda f: len(reply_ids(f)) >= 1)
    reply_id = max(reply_ids(alice.frames))
    await alice.until(lambda f: final_status(alice, reply_id) == "done")
    return reply_id


@pytest.fixture
def cut(world: World) -> World:
    assistant = world.assistants["a"]
    assistant.max_tokens = CUT
    assistant.save()
    return world


async def test_a_reply_cut_off_at_max_tokens_says_so(cut: World) -> None:
    async with member(cut.alice) as alice:
        reply_id = await cut_off_reply(cut, alice)
    stored = await Message.objects.aget(pk=reply_id)
    assert stored.status == "done" and stored.finish_reason == "length" and stored.tokens == CUT
    [final] = final_frames(alice, reply_id)
    assert alice.frames.replies[reply_id].final_attrs["data-finish"] == "length"
    assert "cut off at the token limit" in final
    assert '"action": "continue", "message_id": ' + str(reply_id) in final
    # The transcript says so too.
    assert f"{stored.text}\n\n> cut off at the token limit" in await exported(cut.alice, "md")
    # A reply that ended on its own has neither.
    assistant = cut.assistants["b"]
    async with member(cut.alice) as alice:
        await alice.post("@b short one")
        await alice.until(lambda f: len(reply_ids(f)) >= 2)
        whole = max(reply_ids(alice.frames))
        await alice.until(lambda f: final_status(alice, whole) == "done")
    assert assistant.max_tokens > SIM_TOKENS
    [final] = final_frames(alice, whole)
    assert "data-finish" not in final and "cut off" not in final and '"continue"' not in final


async def test_continue_streams_the_same_reply_on_from_where_it_stopped(cut: World, sim: tuple[str, Any]) -> None:
    app = sim[1]
    async with member(cut.alice) as alice, member(cut.bob) as bob:
        reply_id = await cut_off_reply(cut, alice)
        await bob.until(lambda f: final_status(bob, reply_id) == "done")
        before = await Message.objects.aget(pk=reply_id)
        length = len(before.text)
        requests = len(app.recorded)
        await bob.send(action="continue", message_id=reply_id)  # any member who may regenerate it
        for m in (alice, bob):
            await m.until(lambda f, m=m: len(final_frames(m, reply_id)) == 3 and final_status(m, reply_id) == "done")
        after = await Message.objects.aget(pk=reply_id)
    # One reply, longer: its first text, then the continuation's.
    assert after.text.startswith(before.text) and len(after.text) > length
    assert after.status == "done" and after.tokens == 2 * CUT and after.finish_reason == "length"  # cut off again
    assert after.prompt_tokens > 2 * before.prompt_tokens  # both requests' (the second holds the first answer)
    assert await Message.objects.filter(room=cut.room, role="assistant").acount() == 1
    for m in (alice, bob):
        # The article came again, streaming, holding the text so far; the pieces went on from there.
        again = [f for f in m.raw if f'<article id="msg-{reply_id}"' in f and 'data-status="streaming"' in f]
        assert again and f'data-length="{length}"' in again[-1]
        assert m.frames.replies[reply_id].text == after.text  # gap-free, duplicate-free, whole
    # The model got the history, its partial answer, and the instruction to go on.
    [request] = list(app.recorded)[requests:]
    assert request["messages"][-2] == {"role": "assistant", "content": before.text}
    assert request["messages"][-1] == {"role": "user", "content": CONTINUE_PROMPT}
    assert "tell me everything" in request["messages"][-3]["content"]


async def refused(m: Member, code: str, **frame: Any) -> None:
    await m.send(**frame)
    await m.until(lambda f: any(c == code for c, _ in f.errors))


def snapshot_of(reply_id: int) -> tuple[str, str, str, int | None]:
    r = Message.objects.get(pk=reply_id)
    return r.status, r.finish_reason, r.text, r.tokens


async def test_continue_is_refused_when_it_may_not(cut: World, sim: tuple[str, Any]) -> None:
    app = sim[1]
    async with member(cut.alice) as alice:
        reply_id = await cut_off_reply(cut, alice)
        await alice.post("@b a whole answer")
        await alice.until(lambda f: len(reply_ids(f)) == 2)
        whole = max(reply_ids(alice.frames))
        await alice.until(lambda f: final_status(alice, whole) == "done")
    stored = await database_sync_to_async(snapshot_of)(reply_id)
    requests = len(app.recorded)

    # A reply in another room (bob is not a member there): as if it did not exist.
    def elsewhere() -> int:
        other = Room.objects.create(name="Other", slug="other", owner=cut.carol)
        Membership.objects.create(room=other, user=cut.carol, role=Membership.Role.OWNER)
        other.assistants.add(cut.assistants["a"])
        question = Message.objects.create(
            room=other, seq=1, role="user", author=cut.carol, author_name="carol", text="q"
        )
        return Message.objects.create(
            room=other, seq=2, role="assistant", assistant=cut.assistants["a"], author_name="A", reply_to=question,
            status="done", finish_reason="length", text="cut", finished_at=timezone.now(),
        ).pk  # fmt: skip

    foreign = await database_sync_to_async(elsewhere)()

    # Another member's personal reply (`/each`): not hers to see, so not hers to continue.
    def personal() -> int:
        question = Message.objects.get(pk=Message.objects.get(pk=reply_id).reply_to_id)
        return Message.objects.create(
            room=cut.room, seq=99, role="assistant", assistant=cut.assistants["a"], author_name="A",
            reply_to=question, recipient=cut.alice, status="done", finish_reason="length", text="mine",
            finished_at=timezone.now(),
        ).pk  # fmt: skip

    alices = await database_sync_to_async(personal)()
    async with member(cut.bob) as bob:
        await refused(bob, "reply.not_cut_off", action="continue", message_id=whole)
        await refused(bob, "message.not_found", action="continue", message_id=foreign)
        await refused(bob, "message.not_found", action="continue", message_id=alices)
        await refused(bob, "message.invalid_id", action="continue", message_id="12; drop")
        await refused(bob, "message.invalid_id", action="continue")
        # A locked room: nobody continues (as nobody regenerates).
        await Room.objects.filter(pk=cut.room.pk).aupdate(status=Room.Status.LOCKED)
        await refused(bob, "room.locked", action="continue", message_id=reply_id)
        await Room.objects.filter(pk=cut.room.pk).aupdate(status=Room.Status.OPEN)
        # A spent budget: no reply goes on (the cut reply alone used more than 1 token).
        await Room.objects.filter(pk=cut.room.pk).aupdate(budget_tokens=1)
        await refused(bob, "room.budget", action="continue", message_id=reply_id)
        await Room.objects.filter(pk=cut.room.pk).aupdate(budget_tokens=None)
    assert await database_sync_to_async(snapshot_of)(reply_id) == stored
    assert (await Message.objects.aget(pk=foreign)).status == "done"
    assert (await Message.objects.aget(pk=alices)).text == "mine"
    assert len(app.recorded) == requests  # no model was asked


async def test_continue_is_refused_while_the_reply_streams(cut: World) -> None:
    await stalling(cut, "a")
    async with member(cut.alice) as alice:
        await alice.post("@a stall")
        await alice.until(lambda f: len(reply_ids(f)) == 1 and f.replies[reply_ids(f)[0]].pieces >= 1)
        [reply_id] = reply_ids(alice.frames)
        await refused(alice, "reply.streaming", action="continue", message_id=reply_id)
        assert (await Message.objects.aget(pk=reply_id)).status == "streaming"
        await alice.send(action="stop", message_id=reply_id)
        await alice.until(lambda f: final_status(alice, reply_id) == "stopped")
    # Stopped is not cut off: still refused.
    async with member(cut.alice) as alice:
        await refused(alice, "reply.not_cut_off", action="continue", message_id=reply_id)


async def test_a_continuation_that_fails_before_a_word_stays_cut_off(cut: World) -> None:
    """The provider fails the continuation at once: the reply keeps its text, "length" and
    its Continue button (it can be continued again), rather than ending `failed`."""
    async with member(cut.alice) as alice:
        reply_id = await cut_off_reply(cut, alice)
        before = await database_sync_to_async(snapshot_of)(reply_id)
        await cut.assistants["a"].__class__.objects.filter(pk=cut.assistants["a"].pk).aupdate(model="sim+500")
        await alice.send(action="continue", message_id=reply_id)
        await alice.until(lambda f: len(final_frames(alice, reply_id)) == 3)
    assert await database_sync_to_async(snapshot_of)(reply_id) == before
    assert alice.frames.replies[reply_id].final_attrs["data-finish"] == "length"


async def test_a_reply_whose_question_was_deleted_is_neither_continued_nor_regenerated(
    cut: World, sim: tuple[str, Any]
) -> None:
    app = sim[1]
    async with member(cut.alice) as alice:
        reply_id = await cut_off_reply(cut, alice)
        question = (await Message.objects.aget(pk=reply_id)).reply_to_id
        await alice.send(action="delete", message_id=question)
        await alice.until(lambda f: any('data-deleted="1"' in r for r in alice.raw))
        requests = len(app.recorded)
        await refused(alice, "message.deleted", action="continue", message_id=reply_id)
        await refused(alice, "message.deleted", action="regenerate", message_id=reply_id)
    assert len(app.recorded) == requests
    assert await Message.objects.filter(room=cut.room, role="assistant").acount() == 1


def test_the_orphan_sweep_counts_a_continued_replys_grace_from_its_restart(world: World) -> None:
    """A continued reply is old, but began streaming again just now: before its process
    has leased it, no sweep may take it for an orphan (lifecycle._unleased_candidates)."""
    from datetime import timedelta

    from collab.chat.lifecycle import _unleased_candidates

    question = Message.objects.create(room=world.room, seq=1, role="user", author=world.alice, author_name="alice")
    old = timezone.now() - timedelta(minutes=5)
    reply = Message.objects.create(
        room=world.room, seq=2, role="assistant", assistant=world.assistants["a"], author_name="A",
        reply_to=question, status="streaming", text="so far",
    )  # fmt: skip
    Message.objects.filter(pk=reply.pk).update(created_at=old)
    assert reply.pk in _unleased_candidates(15.0)  # an old streaming reply, never restarted: a candidate
    Message.objects.filter(pk=reply.pk).update(restarted_at=timezone.now())
    assert reply.pk not in _unleased_candidates(15.0)  # continued just now: within its grace
    Message.objects.filter(pk=reply.pk).update(restarted_at=old)
    assert reply.pk in _unleased_candidates(15.0)


async def test_continue_marks_when_the_reply_began_again(cut: World) -> None:
    async with member(cut.alice) as alice:
        reply_id = await cut_off_reply(cut, alice)
        assert (await Message.objects.aget(pk=reply_id)).restarted_at is None
        await alice.send(action="continue", message_id=reply_id)
        await alice.until(lambda f: len(final_frames(alice, reply_id)) == 3 and final_status(alice, reply_id) == "done")
    assert (await Message.objects.aget(pk=reply_id)).restarted_at is not None
