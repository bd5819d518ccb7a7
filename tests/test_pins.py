"""Pinning (docs/wire.md, "pin a message"): the first command written on the registry.
Over real sockets (the consumer in-process), the snapshot, both exports, the refusals
of forged pins; across two real Daphne processes: tests/test_pins_cluster.py."""

from __future__ import annotations

import json
import re
from typing import Any

from channels.db import database_sync_to_async

from collab.chat.models import Membership, Message, Room
from collab.chat.services.rooms import allocate_seqs
from tests.conftest import Member, World, member
from tests.test_history import exported

PINS = re.compile(r'<section id="pins"[^>]*>.*?</section>', re.S)


def pinned_ids(raw: list[str]) -> list[int] | None:
    """The message ids of the last pinned list this socket was sent (None: never sent)."""
    lists = [m.group(0) for frame in raw for m in PINS.finditer(frame)]
    return [int(i) for i in re.findall(r'data-msg="(\d+)"', lists[-1])] if lists else None


async def refused(m: Member, code: str, **frame: Any) -> None:
    before = len(m.frames.errors)
    await m.send(**frame)
    await m.until(lambda f: len(f.errors) > before)
    assert m.frames.errors[-1][0] == code, m.frames.errors[-1]


def put(room: Room, author_name: str, text: str, **kw: Any) -> Message:
    seq = allocate_seqs(room.pk, 1)
    return Message.objects.create(room=room, seq=seq, role="user", author_name=author_name, text=text, **kw)


async def test_a_pin_reaches_every_member_and_the_snapshot_and_the_exports(world: World) -> None:
    question = await database_sync_to_async(put)(world.room, "bob", "the deploy checklist is in ops/deploy.md")
    async with member(world.alice) as alice, member(world.bob) as bob:
        assert pinned_ids(alice.raw) == []  # the snapshot holds the (empty) list
        await bob.send(action="pin", message_id=question.pk)
        for m in (alice, bob):
            await m.until(lambda f, m=m: pinned_ids(m.raw) == [question.pk])
        button = [f for f in alice.raw if f'id="msg-{question.pk}-pin"' in f][-1]
        assert 'class="act unpin"' in button and 'aria-pressed="true"' in button
        assert "pinned by bob" in alice.raw[-1]
    async with member(world.alice) as again:  # a new page: in its snapshot
        assert pinned_ids(again.raw) == [question.pk]
    stored = await database_sync_to_async(Message.objects.get)(pk=question.pk)
    assert stored.pinned_by_name == "bob" and stored.pinned_at is not None
    _, body, _ = await database_sync_to_async(exported)(world.alice, "/r/lab/export.json")
    (record,) = [r for r in json.loads(body)["messages"] if r["id"] == question.pk]
    assert record["pinned"]["by"] == "bob" and record["pinned"]["at"].startswith(str(stored.pinned_at.year))
    _, markdown, _ = await database_sync_to_async(exported)(world.alice, "/r/lab/export.md")
    assert b"> pinned by bob at " in markdown


async def test_only_the_pinner_or_a_moderator_unpins(world: World) -> None:
    first = await database_sync_to_async(put)(world.room, "alice", "first")
    second = await database_sync_to_async(put)(world.room, "bob", "second")
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.send(action="pin", message_id=first.pk)
        await bob.until(lambda f: pinned_ids(bob.raw) == [first.pk])
        await refused(bob, "pin.forbidden", action="unpin", message_id=first.pk)  # alice's pin
        await refused(bob, "pin.already", action="pin", message_id=first.pk)
        await bob.send(action="pin", message_id=second.pk)
        await alice.until(lambda f: pinned_ids(alice.raw) == [second.pk, first.pk])  # newest pin first
        await alice.send(action="unpin", message_id=second.pk)  # the owner: anyone's pin
        await bob.until(lambda f: pinned_ids(bob.raw) == [first.pk])
        await refused(bob, "pin.not_pinned", action="unpin", message_id=second.pk)
        await alice.send(action="unpin", message_id=first.pk)  # her own
        await bob.until(lambda f: pinned_ids(bob.raw) == [])


async def test_forged_pins_are_refused_and_change_nothing(world: World) -> None:
    def setup() -> tuple[Message, Message, Message, Room]:
        shared = put(world.room, "alice", "shared")
        personal = put(world.room, "a", "for bob alone", recipient=world.bob)
        gone = put(world.room, "bob", "", deleted_at=shared.created_at)
        other = Room.objects.create(name="Other", slug="other", owner=world.carol)
        Membership.objects.create(room=other, user=world.carol, role=Membership.Role.OWNER)
        return shared, personal, gone, other

    shared, personal, gone, _other = await database_sync_to_async(setup)()
    async with member(world.alice) as alice, member(world.bob) as bob, member(world.carol, "other") as carol:
        await refused(carol, "message.not_found", action="pin", message_id=shared.pk)  # another room's message
        await refused(alice, "message.not_found", action="pin", message_id=personal.pk)  # bob's personal reply
        await refused(bob, "pin.personal", action="pin", message_id=personal.pk)  # his own: share it first
        await refused(bob, "message.deleted", action="pin", message_id=gone.pk)
        await refused(bob, "message.invalid_id", action="pin", message_id="²")
        await database_sync_to_async(Membership.objects.filter(room=world.room, user=world.bob).delete)()
        await refused(bob, "room.forbidden", action="pin", message_id=shared.pk)  # removed, socket still open
        await database_sync_to_async(Room.objects.filter(pk=world.room.pk).update)(status=Room.Status.LOCKED)
        await refused(alice, "room.locked", action="pin", message_id=shared.pk)
    assert await database_sync_to_async(Message.objects.filter(pinned_at__isnull=False).count)() == 0
