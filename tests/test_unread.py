"""Unread and notifications on the wire (docs/wire.md, "read", "notify"; docs/architecture.md
#a-unread): over real sockets (the consumer in-process), a post in one room reaches the
sidebar of a member who has another room open; `read` is monotonic, bounded to the room's
last seq and reaches every tab of the reader; forged reads are refused; personal replies
and deleted messages are never counted for anyone else. Two real processes:
tests/test_unread_cluster.py; the page: tests/browser/test_unread_page.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from collab.chat.commands.registry import act
from collab.chat.errors import ClientError
from collab.chat.events import UnreadActivity
from collab.chat.models import Membership, Message, Room
from collab.chat.services import unread
from collab.chat.services.rooms import allocate_seqs
from tests.conftest import Member, World, member
from tests.test_pins import put, refused

ENTRY = re.compile(r'<li id="nav-room-(\d+)"[^>]*data-unread="(\d+)" data-mention="(1?)"')


def entry(m: Member, room_id: int) -> tuple[int, bool] | None:
    """(unread, mentioned) of `room_id` as this socket's sidebar last showed it."""
    found = [(int(n), flag == "1") for frame in m.raw for r, n, flag in ENTRY.findall(frame) if int(r) == room_id]
    return found[-1] if found else None


def other_room(world: World) -> Room:
    room = Room.objects.create(name="Other", slug="other", owner=world.alice)
    Membership.objects.create(room=room, user=world.alice, role=Membership.Role.OWNER)
    Membership.objects.create(room=room, user=world.bob)
    return room


def read_seq(world: World, user_id: int, room: Room | None = None) -> int:
    return Membership.objects.get(room=room or world.room, user_id=user_id).read_seq


def last_seq(room: Room) -> int:
    return Room.objects.get(pk=room.pk).last_seq


async def test_a_post_reaches_the_sidebar_of_a_member_in_another_room(world: World) -> None:
    await database_sync_to_async(other_room)(world)
    lab = world.room.pk
    async with member(world.bob, "other") as bob_elsewhere, member(world.alice) as alice:
        assert entry(bob_elsewhere, lab) == (0, False)  # in the snapshot's sidebar
        await alice.post("plain news")
        await bob_elsewhere.until(lambda f: entry(bob_elsewhere, lab) == (1, False))
        await alice.post("@bob have a look")
        await bob_elsewhere.until(lambda f: entry(bob_elsewhere, lab) == (2, True))
        assert entry(alice, lab) is not None and entry(alice, lab) == (0, False)  # her own posts: never unread
        async with member(world.bob) as bob_here:
            assert entry(bob_here, lab) == (2, True)  # the snapshot: what the server counts
            upto = await database_sync_to_async(last_seq)(world.room)
            await bob_here.send(action="read", seq=upto)
            for tab in (bob_elsewhere, bob_here):  # every tab of his, whichever room it shows
                await tab.until(lambda f, tab=tab: entry(tab, lab) == (0, False))
            entries = sum(f.count(f'id="nav-room-{lab}"') for f in bob_here.raw)
            await alice.post("and again")  # counted in his other tab; the open room's page counts it itself
            await bob_elsewhere.until(lambda f: entry(bob_elsewhere, lab) == (1, False))
            await bob_here.until(lambda f: any("and again" in r for r in bob_here.raw))
            await bob_here.assert_silent()
            assert sum(f.count(f'id="nav-room-{lab}"') for f in bob_here.raw) == entries
        assert await database_sync_to_async(read_seq)(world, world.bob.pk) == upto


async def test_read_never_moves_back_and_stops_at_the_last_seq(world: World) -> None:
    for i in range(4):
        await database_sync_to_async(put)(world.room, "alice", f"message {i}")
    async with member(world.bob) as bob:
        await bob.send(action="read", seq=3)
        await bob.until(lambda f: entry(bob, world.room.pk) == (1, False))
        assert await database_sync_to_async(read_seq)(world, world.bob.pk) == 3
        frames_before = len(bob.raw)
        await bob.send(action="read", seq=1)  # back: changes nothing, and says nothing
        await bob.assert_silent()
        assert len(bob.raw) == frames_before
        assert await database_sync_to_async(read_seq)(world, world.bob.pk) == 3
        await refused(bob, "read.beyond_last", action="read", seq=99)
        await refused(bob, "read.invalid_seq", action="read", seq="-1")
        await refused(bob, "read.invalid_seq", action="read", seq=True)
        assert await database_sync_to_async(read_seq)(world, world.bob.pk) == 3
        await bob.send(action="read")  # no seq: all of it
        await bob.until(lambda f: entry(bob, world.room.pk) == (0, False))
        assert await database_sync_to_async(read_seq)(world, world.bob.pk) == 4


async def test_forged_reads_are_refused(world: World) -> None:
    await database_sync_to_async(put)(world.room, "alice", "hello")
    with pytest.raises(ClientError) as refusal:  # carol is no member: as a socket of hers would be told
        await act(world.carol.pk, world.room.pk, "read", seq=1)
    assert refusal.value.code == "room.forbidden"
    with pytest.raises(ClientError) as refusal:
        await act(world.carol.pk, world.room.pk, "notify", level="all")
    assert refusal.value.code == "room.forbidden"
    assert not await database_sync_to_async(Membership.objects.filter(user=world.carol).exists)()


def message(room: Room, author_name: str, text: str, **kw: Any) -> Message:
    kw.setdefault("role", "user")
    return Message.objects.create(room=room, seq=allocate_seqs(room.pk, 1), author_name=author_name, text=text, **kw)


def test_personal_replies_of_others_and_deleted_messages_are_never_counted(world: World) -> None:
    message(world.room, "alice", "for everyone", author=world.alice)
    message(world.room, "a", "for bob alone @alice", recipient=world.bob, role="assistant")
    message(world.room, "bob", "gone @alice", author=world.bob, deleted_at=timezone.now())
    message(world.room, "a", "a hidden version @alice", role="assistant", version_hidden=True)
    message(world.room, "a", "an answer everyone sees", role="assistant")
    (alice,) = [r for r in unread.summary(world.alice.pk, "alice") if r.room_id == world.room.pk]
    (bob,) = [r for r in unread.summary(world.bob.pk, "bob") if r.room_id == world.room.pk]
    assert (alice.count, alice.mentioned) == (1, False)  # the shared answer; not her own, nor bob's reply
    assert (bob.count, bob.mentioned) == (3, False)  # alice's, his personal reply, the shared answer
    # Live, the same rule: an event's personal reply for bob counts for him alone.
    event: UnreadActivity = {
        "type": "unread.activity",
        "room_id": world.room.pk,
        "items": [
            {"seq": 100, "author": world.bob.pk, "to": 0, "mentions": ["alice"]},
            {"seq": 101, "author": 0, "to": world.bob.pk, "mentions": []},
            {"seq": 102, "author": 0, "to": 0, "mentions": []},
        ],
    }
    for user, name, counted, mentioned in ((world.alice, "alice", 3, True), (world.bob, "bob", 5, False)):
        tracker = unread.Tracker.load(user.pk, name, world.room.pk)
        assert tracker.on_activity(event) is not None
        assert (tracker.rooms[world.room.pk].count, tracker.rooms[world.room.pk].mentioned) == (counted, mentioned)
        assert tracker.on_activity(event) is None  # the same seqs again: counted once


async def test_personal_replies_are_not_counted_for_others_live(world: World) -> None:
    """/each makes bob a personal reply: alice's sidebar elsewhere counts the question only."""

    def setup() -> None:
        other_room(world)
        Membership.objects.filter(room=world.room, user=world.bob).update(lens="answer in French")

    await database_sync_to_async(setup)()
    lab = world.room.pk
    async with member(world.alice, "other") as alice_elsewhere, member(world.bob) as bob:
        await bob.post("/each @a what is new?")
        await alice_elsewhere.until(lambda f: entry(alice_elsewhere, lab) == (1, False))
        await bob.until(lambda f: any(r.role == "assistant" for r in f.replies.values()))
        await alice_elsewhere.assert_silent()
        assert entry(alice_elsewhere, lab) == (1, False)
    count = await database_sync_to_async(
        lambda: [r.count for r in unread.summary(world.alice.pk, "alice") if r.room_id == lab]
    )()
    assert count == [1]


async def test_snapshot_and_resume_are_as_before_with_the_sidebar(world: World) -> None:
    first = await database_sync_to_async(put)(world.room, "alice", "one")
    async with member(world.bob) as bob:
        snapshot = bob.raw[0]
        assert 'id="rooms-list"' in snapshot and f'id="msg-{first.pk}"' in snapshot
        assert sorted(bob.frames.replies) == [first.pk]
        await bob.send(action="read", seq=first.seq)
        await bob.until(lambda f: entry(bob, world.room.pk) == (0, False))
        await bob.send(action="notify", level="all")
        await bob.until(lambda f: any('id="notify"' in r and 'data-level="all"' in r for r in bob.raw))
    async with member(world.bob) as again:  # a reconnect: the same messages, the count as stored
        assert sorted(again.frames.replies) == [first.pk]
        assert entry(again, world.room.pk) == (0, False)
        assert again.frames.snapshots == 1


async def test_notify_is_stored_per_member_and_room_and_checked(world: World) -> None:
    async with member(world.bob) as bob, member(world.bob) as bob2, member(world.alice) as alice:
        await bob.send(action="notify", level="none")
        for tab in (bob, bob2):  # every tab of his in the room
            await tab.until(lambda f, tab=tab: any('id="notify"' in r and 'data-level="none"' in r for r in tab.raw))
        await refused(bob, "notify.invalid", action="notify", level="loud")
        await alice.assert_silent()
        assert not any('id="notify"' in r and "hx-swap-oob" in r for r in alice.raw)
    levels = await database_sync_to_async(
        lambda: dict(Membership.objects.filter(room=world.room).values_list("user__username", "notify"))
    )()
    assert levels == {"alice": "mentions", "bob": "none"}


async def test_a_flood_of_reads_is_bounded(world: World) -> None:
    for i in range(3):
        await database_sync_to_async(put)(world.room, "alice", f"m{i}")
    async with member(world.bob) as bob:
        for _ in range(12):  # the burst is 10, refilled one each 0.5 s
            await bob.send(action="read", seq=1)
        await bob.until(lambda f: any(code == "rate.limited" for code, _ in f.errors))


async def test_a_room_the_member_was_removed_from_leaves_the_sidebar(world: World) -> None:
    await database_sync_to_async(other_room)(world)
    lab = world.room.pk
    async with member(world.bob, "other") as bob_elsewhere, member(world.alice) as alice:
        await alice.send(action="kick", username="bob")
        await bob_elsewhere.until(
            lambda f: any(f'<li id="nav-room-{lab}" hx-swap-oob="delete">' in r for r in bob_elsewhere.raw)
        )
        await alice.post("after he left")
        await alice.until(lambda f: any("after he left" in r for r in alice.raw))
        await bob_elsewhere.assert_silent()  # nothing of the room he left, not even a count
        assert entry(bob_elsewhere, lab) == (0, False)
