"""Versions of a reply (issue 34, item 4; docs/wire.md, "regenerate a reply" and "show a
version"): Regenerate makes a new version of the reply in its place, not a second reply
under it; `show_version` chooses, for everyone who sees the reply, which version the
room shows; the next turn's history, snapshots and pages hold that version alone.

Over the wire, in one process (the in-memory layer, and Redis for the main flow), the
real openai client against the simulated model, which records what it is sent. Each
version is asked with another room prompt, so that the simulated model (the same text
for the same request) writes each a text of its own. The same flows across two real
processes: tests/test_versions_cluster.py."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from collab.chat.models import Membership, Message, Room
from collab.loadtest import wire
from tests.conftest import Member, World, connected, member, reply_ids, session_cookie
from tests.test_personal_replies import drain, recorded_with, refused, set_lens, settle, tabs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("replies_idle")]
live = pytest.mark.usefixtures("layer")  # in memory, and on Redis (both channel layers)
memory = pytest.mark.usefixtures("memory_layer")


def ended(m: Member, reply_id: int) -> bool:
    r = m.frames.replies.get(reply_id)
    return r is not None and r.final_attrs.get("data-status") == "done"


async def replied(m: Member, **frame: Any) -> int:
    """Send `frame` (a post that mentions one assistant, a regeneration); the id of the
    reply it makes, once this socket has its final article."""
    stored = {pk async for pk in Message.objects.filter(role="assistant").values_list("pk", flat=True)}
    await m.send(**frame)
    await m.until(lambda f: bool(set(reply_ids(f)) - stored))
    (reply_id,) = set(reply_ids(m.frames)) - stored
    await m.until(lambda f: ended(m, reply_id))
    return reply_id


async def asked(m: Member, text: str) -> int:
    return await replied(m, text=text, client_id=str(uuid.uuid4()))


async def again(m: Member, world: World, reply_id: int, prompt: str) -> int:
    """Regenerate `reply_id` under another room prompt; the new version's id, once ended."""
    await Room.objects.filter(pk=world.room.pk).aupdate(system_prompt=prompt)
    return await replied(m, action="regenerate", message_id=reply_id)


async def three_versions(alice: Member, bob: Member, world: World) -> list[int]:
    """alice asks @a; alice, then bob, ask again: the slot's three versions' ids."""
    first = await asked(alice, "@a which fruit for the party?")
    second = await again(alice, world, first, "round two")
    third = await again(bob, world, second, "round three")
    await alice.until(lambda f: ended(alice, third))
    return [first, second, third]


def sent_to(m: Member, msg_id: int) -> list[wire.ArticleInfo]:
    """Every article of message `msg_id` this socket was sent, in order."""
    return [a for frame in m.raw for a in wire.articles(frame) if a.msg == msg_id]


def swapped_in(m: Member, msg_id: int, versions: int) -> list[wire.ArticleInfo]:
    """The articles of message `msg_id` sent to this socket to take its slot's place, once
    its slot had `versions` versions."""
    return [
        a
        for a in sent_to(m, msg_id)
        if a.attrs.get("hx-swap-oob", "").startswith("outerHTML:") and a.attrs.get("data-versions") == str(versions)
    ]


def slot_in(html: str, slot: int) -> list[wire.ArticleInfo]:
    """The articles of one slot in a page or a snapshot."""
    return [a for a in wire.articles(html) if a.attrs.get("data-slot") == str(slot)]


def over_http(user: Any) -> dict[str, str]:
    """The room page, and its older messages (every one before seq 1000), as `user` gets them."""
    c = Client()
    c.force_login(user)
    return {
        "room page": c.get("/r/lab/").content.decode(),
        "older page": c.get("/r/lab/older/?before=1000").content.decode(),
    }


def versions_of(first: int) -> list[tuple[int, int | None, int | None, int, int, bool]]:
    rows = Message.objects.filter(role="assistant").order_by("seq")
    fields = ("id", "version_of_id", "slot_seq", "version", "versions", "version_hidden")
    return [r for r in rows.values_list(*fields) if first in (r[0], r[1])]


@live
async def test_regenerating_twice_keeps_one_slot_of_three_versions_in_place(world: World) -> None:
    async with member(world.alice) as alice, member(world.bob) as bob:
        first, second, third = await three_versions(alice, bob, world)
        await bob.until(lambda f: ended(bob, third))
    question = await Message.objects.aget(role="user")
    seq = (await Message.objects.aget(pk=first)).seq
    assert await database_sync_to_async(versions_of)(first) == [
        (first, None, None, 1, 3, True),
        (second, first, seq, 2, 3, True),
        (third, first, seq, 3, 3, False),
    ]
    texts = [m.text async for m in Message.objects.filter(pk__in=[first, second, third])]
    assert len(set(texts)) == 3 and all(texts)
    assert await Message.objects.filter(role="assistant", reply_to=question).acount() == 3
    for m in (alice, bob):
        new, *_, final = sent_to(m, third)
        # In the slot's place, never appended after it.
        assert new.attrs["hx-swap-oob"] == f"outerHTML:article[data-slot='{first}']"
        assert new.attrs["data-status"] == "streaming"
        assert final.attrs["hx-swap-oob"] == "true" and final.attrs["data-status"] == "done"
        for a in (new, final):
            assert (a.attrs["data-slot"], a.attrs["data-slot-seq"]) == (str(first), str(seq))
            assert (a.attrs["data-version"], a.attrs["data-versions"]) == ("3", "3")
        assert 'aria-label="Previous version"' in final.inner and 'aria-live="polite">3 / 3<' in final.inner
        assert (
            '"version": 2}' in final.inner and 'aria-label="Next version" title="Next version" disabled' in final.inner
        )
        appended = [f for f in m.raw if f.startswith('<div id="messages" hx-swap-oob="beforeend"')]
        assert not any(f'id="msg-{v}"' in f for f in appended for v in (second, third))
        assert m.frames.errors == []


@memory
async def test_the_version_shown_is_the_one_the_next_turn_is_sent_and_not_the_others(
    world: World, sim: tuple[str, Any]
) -> None:
    async with member(world.alice) as alice, member(world.bob) as bob:
        first, second, third = await three_versions(alice, bob, world)
        await alice.send(action="show_version", message_id=third, version=2)
        for m in (alice, bob):  # everybody's page: version 2 in the slot's place
            await m.until(lambda f, m=m: bool(swapped_in(m, second, 3)))
            (shown,) = swapped_in(m, second, 3)
            assert shown.attrs["hx-swap-oob"] == f"outerHTML:article[data-slot='{first}']"
            assert (shown.attrs["data-version"], shown.attrs["data-versions"]) == ("2", "3")
            assert shown.attrs["data-status"] == "done" and 'aria-live="polite">2 / 3<' in shown.inner
        await asked(bob, "@b and which drink goes with it?")
    texts = {m.id: m.text async for m in Message.objects.filter(pk__in=[first, second, third])}
    requests = recorded_with(sim, "and which drink goes with it?")
    assert requests
    for request in requests:
        sent = "\n".join(str(turn["content"]) for turn in request)
        assert texts[second] in sent, "the shown version is the slot's answer"
        assert texts[first] not in sent and texts[third] not in sent, "a hidden version was sent"
        assert sent.index("which fruit") < sent.index(texts[second]) < sent.index("which drink")
    stored = await database_sync_to_async(versions_of)(first)
    assert [hidden for *_, hidden in stored] == [True, False, True]


@memory
async def test_a_late_snapshot_and_the_pages_of_history_show_the_shown_version_in_its_place(world: World) -> None:
    async with member(world.alice) as alice, member(world.bob) as bob:
        first = await asked(alice, "@a which fruit for the party?")
        await bob.post("a note posted before it was asked again")
        await alice.until(lambda f: any("a note posted" in raw for raw in alice.raw))
        second = await again(alice, world, first, "round two")
        await again(bob, world, second, "round three")
        await alice.send(action="show_version", message_id=second)
        await bob.until(lambda f: bool(swapped_in(bob, second, 3)))
    question = await Message.objects.aget(role="user", text__contains="which fruit")
    note = await Message.objects.aget(role="user", text__startswith="a note")
    cookie = await database_sync_to_async(session_cookie)(world.alice)
    async with connected(world.alice, "lab", cookie=cookie) as (ok, _code, late):
        assert ok
        await late.until(lambda f: f.snapshots == 1)
    pages = {"snapshot": late.raw[0], **await database_sync_to_async(over_http)(world.alice)}
    for name, html in pages.items():
        (shown,) = slot_in(html, first)
        assert shown.msg == second, name
        assert (shown.attrs["data-version"], shown.attrs["data-versions"]) == ("2", "3"), name
        assert 'aria-live="polite">2 / 3<' in shown.inner, name
        order = [a.msg for a in wire.articles(html)]
        assert order.index(question.pk) < order.index(second) < order.index(note.pk), name


@memory
async def test_show_version_is_refused_with_its_code_and_changes_nothing(world: World) -> None:
    await Membership.objects.filter(room=world.room, user=world.bob).aupdate(lens="in Spanish")
    async with tabs(world.alice, world.bob) as (alice, bob):
        first = await asked(alice, "@a which fruit?")
        single = await asked(alice, "@b and a drink?")
        second = await again(alice, world, first, "round two")
        await alice.post("/each @a what about dessert?")
        await bob.until(lambda f: any(r.final_attrs for i, r in f.replies.items() if i not in (first, second, single)))
        await settle()
        (personal,) = [m.pk async for m in Message.objects.filter(recipient=world.bob)]
        question = await Message.objects.filter(role="user").afirst()
        assert question is not None
        await drain(bob)
        before = await database_sync_to_async(versions_of)(first)
        for fields, code in (
            ({"message_id": 10**9}, "message.not_found"),
            ({"message_id": personal}, "message.not_found"),  # bob's personal reply: alice cannot see it
            ({"message_id": question.pk}, "message.not_found"),  # a person's message is no reply
            ({"message_id": "12a"}, "message.invalid_id"),
            ({"message_id": single}, "version.none"),
            ({"message_id": second, "version": 3}, "version.not_found"),
            ({"message_id": second, "version": 0}, "version.invalid"),
            ({"message_id": second, "version": "two"}, "version.invalid"),
            ({"message_id": second, "version": True}, "version.invalid"),
        ):
            assert await refused(alice, action="show_version", **fields) == code, fields
        await Room.objects.filter(pk=world.room.pk).aupdate(status=Room.Status.LOCKED)
        assert await refused(alice, action="show_version", message_id=first) == "room.locked"
        await Room.objects.filter(pk=world.room.pk).aupdate(status=Room.Status.ARCHIVED)
        assert await refused(alice, action="show_version", message_id=first) == "room.archived"
        await Room.objects.filter(pk=world.room.pk).aupdate(status=Room.Status.OPEN)
        await Message.objects.filter(pk=first).aupdate(status=Message.Status.STREAMING)
        assert await refused(alice, action="show_version", message_id=first) == "reply.streaming"
        await Message.objects.filter(pk=first).aupdate(status=Message.Status.DONE)
        assert await database_sync_to_async(versions_of)(first) == before
        await bob.assert_silent()  # nobody was sent a thing
        await alice.send(action="show_version", message_id=second)  # shown already: nothing to do
        await alice.assert_silent()
        await bob.assert_silent()
        assert await database_sync_to_async(versions_of)(first) == before


@memory
async def test_a_personal_replys_versions_stay_its_recipients_until_shared(world: World, sim: tuple[str, Any]) -> None:
    await Membership.objects.filter(room=world.room, user=world.bob).aupdate(lens="")
    async with tabs(world.alice, world.bob) as (alice, bob):
        await set_lens(bob, "answer in Spanish")
        await alice.post("/each @a what about dessert?")
        await bob.until(lambda f: any(r.final_attrs for r in f.replies.values() if r.role == "assistant"))
        await settle()
        (first,) = [m.pk async for m in Message.objects.filter(recipient=world.bob)]
        await drain(alice)
        second = await again(bob, world, first, "round two")
        await bob.send(action="show_version", message_id=second, version=1)
        await bob.until(lambda f: bool(swapped_in(bob, first, 2)))
        await alice.assert_silent()
        assert not any(f'msg-{v}"' in raw for raw in alice.raw for v in (first, second))
        assert await refused(alice, action="show_version", message_id=second) == "message.not_found"
        await bob.send(action="share", message_id=first)
        await alice.until(lambda f: bool(sent_to(alice, first)))
    rows = Message.objects.filter(pk__in=[first, second]).order_by("version")
    assert [(m.recipient_id, m.version_hidden) async for m in rows] == [(None, False), (None, True)]
    assert not sent_to(alice, second) and sent_to(alice, first)[-1].attrs["data-version"] == "1"
