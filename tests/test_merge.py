"""Merge (docs/wire.md, "merge"): the approved answers to a person's message combined by
one assistant into one reply, which streams to every member with `data-merge-of` and a
"merged from" mark; the simulated model (a real server, which records what it is sent)
gets each approved answer, labelled, and never a rejected one. Fewer than two approved
answers: `merge.not_enough`. Refused (nothing stored, no model asked): a non-member,
a locked room, a spent budget, read-only staff, another room's message, bad ids.

The votes are made directly in the database (Vote rows and the reply's counts, as
services/votes.py keeps them, with the verdict of the room's rule: votes.verdict_of)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User

from collab.chat.commands.registry import act
from collab.chat.errors import ClientError
from collab.chat.models import Membership, Message, Room, Vote
from collab.chat.replies import merging
from collab.chat.services.votes import verdict_of
from collab.loadtest import wire
from tests.conftest import Member, World, connected, member

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("replies_idle")]
live = pytest.mark.usefixtures("layer")  # in memory, and on Redis (both channel layers)
memory = pytest.mark.usefixtures("memory_layer")


@dataclass
class Asked:
    question: int
    apples: int  # @a's answer, approved
    bananas: int  # @b's answer, approved
    cherries: int  # @a's second answer, rejected


def vote(reply: Message, votes: dict[User, str]) -> None:
    for user, value in votes.items():
        Vote.objects.create(message=reply, voter=user, voter_name=user.username, value=value)
    reply.votes_up = sum(v == "up" for v in votes.values())
    reply.votes_down = sum(v == "down" for v in votes.values())
    reply.verdict = verdict_of(reply.room, reply.votes_up, reply.votes_down, online=0)
    reply.save(update_fields=["votes_up", "votes_down", "verdict"])


def ask(world: World, approve_bananas: bool = True, room: Room | None = None) -> Asked:
    """alice's question with three answers: apples (approved by both), bananas (approved
    by both, or left unvoted), cherries (rejected by both)."""
    room = room or world.room
    first = room.last_seq + 1
    question = Message.objects.create(
        room=room, seq=first, role="user", author=world.alice, author_name="alice", text="Which fruit for the party?"
    )

    def answer(seq: int, handle: str, text: str) -> Message:
        a = world.assistants[handle]
        return Message.objects.create(
            room=room, seq=seq, role="assistant", assistant=a, author_name=a.display_name, reply_to=question,
            text=text, html=f"<p>{text}</p>", tokens=30, prompt_tokens=20,
        )  # fmt: skip

    apples = answer(first + 1, "a", "APPLES keep well and everyone eats them.")
    bananas = answer(first + 2, "b", "BANANAS need no knife.")
    cherries = answer(first + 3, "a", "CHERRIES are poisonous, avoid fruit.")
    Room.objects.filter(pk=room.pk).update(last_seq=first + 3)
    room.last_seq = first + 3
    both_up = {world.alice: "up", world.bob: "up"}
    vote(apples, both_up)
    if approve_bananas:
        vote(bananas, both_up)
    vote(cherries, {world.alice: "down", world.bob: "down"})
    return Asked(question.pk, apples.pk, bananas.pk, cherries.pk)


aask = database_sync_to_async(ask)


def requests(sim: tuple[str, Any]) -> int:
    return len(sim[1].recorded)


def messages_now() -> list[tuple[int, int, list[int]]]:
    return list(Message.objects.order_by("id").values_list("id", "seq", "merge_of"))


def articles(m: Member, msg_id: int) -> list[dict[str, str]]:
    """The attributes of every article of `msg_id` this socket was sent."""
    found = []
    for frame in m.raw:
        for article in wire.articles(frame):
            if article.msg == msg_id:
                found.append(article.attrs)
    return found


def final_of(m: Member, msg_id: int) -> bool:
    r = m.frames.replies.get(msg_id)
    return r is not None and bool(r.final_attrs)


async def refused(m: Member, code: str, **content: Any) -> None:
    n = len(m.frames.errors)
    await m.send(action="merge", **content)
    await m.until(lambda f: len(f.errors) > n)
    assert m.frames.errors[n][0] == code, m.frames.errors[n]


@live
async def test_a_merge_streams_to_every_member_with_what_it_drew_from(world: World, sim: tuple[str, Any]) -> None:
    asked = await aask(world)
    before = requests(sim)
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.send(action="merge", message_id=asked.question)

        def merged(f: Any) -> bool:
            return any(r.final_attrs.get("data-merge-of") for r in f.replies.values())

        await alice.until(merged)
        await bob.until(merged)
    stored = await database_sync_to_async(
        lambda: Message.objects.select_related("assistant").exclude(merge_of=[]).get()
    )()
    sources = f"{asked.apples},{asked.bananas}"
    assert stored.merge_of == [asked.apples, asked.bananas]
    seqs = await database_sync_to_async(
        lambda: list(Message.objects.filter(pk__in=stored.merge_of).order_by("seq").values_list("seq", flat=True))
    )()
    assert stored.merge_seqs == seqs  # the numbers the page and exports show (ids differ once rooms share a table)
    assert stored.reply_to_id == asked.question and stored.seq == world.room.last_seq + 1
    assert stored.status == "done" and stored.text
    assert stored.assistant is not None and stored.assistant.handle == "a"  # the room's default
    for m in (alice, bob):
        new, *_, final = articles(m, stored.pk)
        assert "hx-swap-oob" not in new and new["data-status"] == "streaming"
        assert new["data-merge-of"] == final["data-merge-of"] == sources
        assert new["data-reply-to"] == str(asked.question)
        assert final["data-status"] == "done"
        shown = "".join(f for f in m.raw if f'id="msg-{stored.pk}"' in f)
        assert (
            f'href="#msg-{asked.apples}">#{seqs[0]}</a>' in shown
            and f'href="#msg-{asked.bananas}">#{seqs[1]}</a>' in shown
        )
        assert "merged from" in shown
        assert m.frames.errors == []
    # The model's request: each approved answer, labelled with its assistant and seq; never the rejected one.
    (request,) = sim[1].recorded[before:]
    sent = "\n".join(str(turn["content"]) for turn in request["messages"])
    last = str(request["messages"][-1]["content"])
    assert "APPLES" in last and "BANANAS" in last and "Which fruit for the party?" in sent
    assert f"[#{seqs[0]}]" in last and "@a" in last and f"[#{seqs[1]}]" in last and "@b" in last
    assert "CHERRIES" not in sent


@memory
async def test_a_named_assistant_merges_and_an_unknown_one_is_refused(world: World, sim: tuple[str, Any]) -> None:
    asked = await aask(world)
    before, stored = requests(sim), await database_sync_to_async(messages_now)()
    async with member(world.bob) as bob:
        await refused(bob, "assistant.unavailable", message_id=asked.question, assistant="@nobody")
        await refused(bob, "merge.invalid_assistant", message_id=asked.question, assistant=["b"])
        assert await database_sync_to_async(messages_now)() == stored and requests(sim) == before
        await bob.send(action="merge", message_id=asked.question, assistant="@B")
        await bob.until(lambda f: any(r.final_attrs.get("data-merge-of") for r in f.replies.values()))
    stored = await database_sync_to_async(
        lambda: Message.objects.select_related("assistant").exclude(merge_of=[]).get()
    )()
    assert stored.assistant is not None and stored.assistant.handle == "b"
    assert requests(sim) == before + 1


@memory
async def test_fewer_than_two_approved_answers_get_merge_not_enough(world: World, sim: tuple[str, Any]) -> None:
    asked = await aask(world, approve_bananas=False)  # apples approved, bananas unvoted, cherries rejected
    before, stored = requests(sim), await database_sync_to_async(messages_now)()
    async with member(world.bob) as bob:
        await refused(bob, "merge.not_enough", message_id=asked.question)
        _, text = bob.frames.errors[0]
        assert "two approved" in text and "has 1" in text
    assert requests(sim) == before
    assert await database_sync_to_async(messages_now)() == stored
    assert (await database_sync_to_async(Room.objects.get)(pk=world.room.pk)).last_seq == world.room.last_seq


@memory
async def test_who_may_not_post_may_not_merge_and_nothing_changes(world: World, sim: tuple[str, Any]) -> None:
    asked = await aask(world)
    before, stored = requests(sim), await database_sync_to_async(messages_now)()

    def setup_other() -> tuple[int, User]:
        other = Room.objects.create(name="Other", slug="other", owner=world.carol)
        Membership.objects.create(room=other, user=world.carol, role=Membership.Role.OWNER)
        other.assistants.add(*world.assistants.values())
        staff = User.objects.create_user("dave", password="pw-dave-123", is_staff=True)
        return other.pk, staff

    other_id, staff = await database_sync_to_async(setup_other)()
    # Not a member of the room (the socket would be refused: the action itself refuses too).
    with pytest.raises(ClientError) as exc:
        await act(world.carol.pk, world.room.pk, "merge", message_id=asked.question)
    assert exc.value.code == "room.forbidden"
    # A member of another room, forging a merge of this room's message from there.
    async with member(world.carol, "other") as carol:
        await refused(carol, "message.not_found", message_id=asked.question)
    with pytest.raises(ClientError) as exc:
        await act(world.carol.pk, other_id, "merge", message_id=asked.question)
    assert exc.value.code == "message.not_found"
    # Staff viewing the room read-only.
    async with connected(staff, "lab") as (ok, _code, viewer):
        assert ok
        await viewer.until(lambda f: f.snapshots >= 1)
        await refused(viewer, "room.read_only", message_id=asked.question)
    async with member(world.bob) as bob:
        # A locked room.
        await database_sync_to_async(Room.objects.filter(pk=world.room.pk).update)(status=Room.Status.LOCKED)
        await refused(bob, "room.locked", message_id=asked.question)
        await database_sync_to_async(Room.objects.filter(pk=world.room.pk).update)(status=Room.Status.OPEN)
        # A spent budget (the answers used 150 tokens this month).
        await database_sync_to_async(Room.objects.filter(pk=world.room.pk).update)(budget_tokens=100)
        await refused(bob, "room.budget", message_id=asked.question)
    assert requests(sim) == before  # no model was asked
    assert await database_sync_to_async(messages_now)() == stored


@memory
async def test_what_is_not_a_question_of_this_room_gets_a_clear_code(world: World, sim: tuple[str, Any]) -> None:
    asked = await aask(world)

    def personal_and_deleted() -> tuple[int, int]:
        room = Room.objects.get(pk=world.room.pk)
        seq = room.last_seq + 1
        theirs = Message.objects.create(
            room=room, seq=seq, role="assistant", assistant=world.assistants["a"], author_name="A",
            reply_to_id=asked.question, recipient=world.alice, text="for alice only",
        )  # fmt: skip
        gone = Message.objects.create(
            room=room,
            seq=seq + 1,
            role="user",
            author=world.bob,
            author_name="bob",
            text="",
            deleted_at=theirs.created_at,
        )
        Room.objects.filter(pk=room.pk).update(last_seq=seq + 1)
        return theirs.pk, gone.pk

    personal, deleted = await database_sync_to_async(personal_and_deleted)()
    before, stored = requests(sim), await database_sync_to_async(messages_now)()
    async with member(world.bob) as bob:
        await refused(bob, "message.invalid_id", message_id="12a")
        await refused(bob, "message.invalid_id", message_id=True)
        await refused(bob, "message.not_found", message_id=10**9)
        await refused(bob, "message.not_found", message_id=personal)  # alice's personal reply: bob cannot see it
        await refused(bob, "merge.not_question", message_id=asked.apples)
        await refused(bob, "message.deleted", message_id=deleted)
    async with member(world.alice) as alice:
        await refused(alice, "merge.not_question", message_id=personal)  # hers: a reply, not a question
    assert requests(sim) == before
    assert await database_sync_to_async(messages_now)() == stored


@memory
async def test_a_merge_asked_again_or_continued_draws_on_the_same_answers(world: World, sim: tuple[str, Any]) -> None:
    asked = await aask(world)

    def cut_off_merge() -> int:
        room = Room.objects.get(pk=world.room.pk)
        merge = Message.objects.create(
            room=room, seq=room.last_seq + 1, role="assistant", assistant=world.assistants["b"], author_name="B",
            reply_to_id=asked.question, text=f"Take APPLES [#{asked.apples}] and", tokens=20,
            finish_reason="length", merge_of=[asked.apples, asked.bananas],
        )  # fmt: skip
        Room.objects.filter(pk=room.pk).update(last_seq=room.last_seq + 1)
        return merge.pk

    merge_id = await database_sync_to_async(cut_off_merge)()
    sources = f"{asked.apples},{asked.bananas}"
    async with member(world.bob) as bob:
        before = requests(sim)
        await bob.send(action="continue", message_id=merge_id)
        await bob.until(lambda f: f.replies[merge_id].final_attrs.get("data-status") == "done")
        (continued,) = sim[1].recorded[before:]
        turns = [str(t["content"]) for t in continued["messages"]]
        assert "APPLES keep well" in turns[-3] and "BANANAS" in turns[-3]  # the answers, then the partial merge
        assert turns[-2].startswith("Take APPLES") and "CHERRIES" not in "".join(turns)
        await bob.send(action="regenerate", message_id=merge_id)
        await bob.until(
            lambda f: any(i != merge_id and r.final_attrs.get("data-merge-of") for i, r in f.replies.items())
        )
        again = await database_sync_to_async(lambda: Message.objects.exclude(pk=merge_id).exclude(merge_of=[]).get())()
    assert again.merge_of == [asked.apples, asked.bananas] and again.reply_to_id == asked.question
    assert bob.frames.replies[again.pk].final_attrs["data-merge-of"] == sources
    (regenerated,) = sim[1].recorded[before + 1 :]
    last = str(regenerated["messages"][-1]["content"])
    assert "APPLES keep well" in last and "BANANAS" in last and "CHERRIES" not in str(regenerated["messages"])


def test_a_merge_is_not_an_answer_to_merge_and_a_redo_leaves_out_what_was_rejected_since(world: World) -> None:
    """approved_replies: the approved answers, not an approved merge of them (it would
    bring an unapproved source back in). redo: a merge asked again drops a source the room
    voted down since; with fewer than two left, merge.not_enough."""
    from collab.chat.services.votes import approved_replies

    asked = ask(world)
    question = Message.objects.get(pk=asked.question)
    merge = Message.objects.create(
        room=world.room, seq=world.room.last_seq + 1, role="assistant", assistant=world.assistants["a"],
        author_name="A", reply_to=question, text="apples and bananas", merge_of=[asked.apples, asked.bananas],
    )  # fmt: skip
    vote(merge, {world.alice: "up"})
    assert [m.pk for m in approved_replies(question)] == [asked.apples, asked.bananas]
    Message.objects.filter(pk=asked.bananas).update(verdict="rejected", votes_up=0, votes_down=2)
    job = merging.ReplyJob(merge.pk, world.room.pk, None, "sim", [], None, None)  # type: ignore[arg-type]
    with pytest.raises(ClientError) as refused:
        merging.redo(merge, job, merge.merge_of)
    assert refused.value.code == "merge.not_enough"
