"""Typing (docs/wire.md, "typing"): `{"action": "typing"}` shows "NAME is typing…" to the
others (never to NAME's own tabs), capped per member and room across sockets and
processes (the shared state: memory, and a real Redis), refused from a read-only staff
socket. Real WebSocket clients; the page's own clearing is tests/browser/test_typing_page.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User

from collab.chat import metrics
from collab.chat.commands.registry import act
from collab.chat.errors import ClientError
from collab.chat.models import Message, Room
from tests.conftest import Member, World, connected, member

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("layer", "replies_idle")]

TYPING_RE = re.compile(r'<div id="typing" hx-swap-oob="beforeend"><span class="typing-who" data-user="([^"]+)">')


def typing_frames(m: Member) -> list[str]:
    return [name for frame in m.raw for name in TYPING_RE.findall(frame)]


def dropped() -> float:
    return float(metrics.TYPING.labels("dropped")._value.get())


def posted(m: Member, text: str) -> bool:
    return any(text in frame and "<article" in frame for frame in m.raw)


async def test_the_others_see_who_is_typing_and_the_typer_does_not(world: World) -> None:
    async with member(world.alice) as alice, member(world.bob) as bob, member(world.bob) as bob_tab2:
        await bob.send(action="typing")
        await alice.until(lambda f: bool(typing_frames(alice)))
        assert typing_frames(alice) == ["bob"]
        assert "bob is typing…" in alice.raw[-1]
        # Neither of bob's tabs is told about bob: alice's post, sent after the notice reached
        # her, reaches every socket of the room after it would have.
        await alice.post("marker")
        await bob.until(lambda f: posted(bob, "marker"))
        await bob_tab2.until(lambda f: posted(bob_tab2, "marker"))
        assert typing_frames(bob) == [] and typing_frames(bob_tab2) == []


async def test_a_flood_from_two_tabs_gives_one_notice_the_rest_dropped_and_counted(world: World, settings: Any) -> None:
    settings.COLLAB = {**settings.COLLAB, "TYPING_EVERY_S": 600.0}  # the cap alone: counts, not time
    before = dropped()
    async with member(world.alice) as alice, member(world.bob) as bob, member(world.bob) as bob_tab2:
        for _ in range(20):
            await bob.send(action="typing")
            await bob_tab2.send(action="typing")
        # Each socket's actions run in order: once both posts are in the room, every typing
        # frame before them has been handled (and any broadcast sent before the post's).
        await bob.post("first tab done")
        await bob_tab2.post("second tab done")
        await alice.until(lambda f: posted(alice, "first tab done") and posted(alice, "second tab done"))
        assert typing_frames(alice) == ["bob"]
        assert dropped() - before == 39
        assert bob.frames.errors == [] and bob_tab2.frames.errors == []  # dropped without a word


async def test_the_cap_is_per_member(world: World, settings: Any) -> None:
    settings.COLLAB = {**settings.COLLAB, "TYPING_EVERY_S": 600.0}
    async with member(world.alice) as alice, member(world.bob) as bob:
        for _ in range(5):
            await alice.send(action="typing")
            await bob.send(action="typing")
        await alice.post("alice done")
        await bob.post("bob done")
        await alice.until(lambda f: posted(alice, "bob done"))
        await bob.until(lambda f: posted(bob, "alice done"))
        assert typing_frames(alice) == ["bob"]
        assert typing_frames(bob) == ["alice"]


async def test_typing_from_a_read_only_staff_socket_is_refused_and_nobody_told(world: World) -> None:
    staff = await database_sync_to_async(User.objects.create_user)("dave", password="pw-dave-123", is_staff=True)
    async with member(world.alice) as alice, connected(staff, "lab") as (ok, _code, dave):
        assert ok
        await dave.until(lambda f: f.snapshots == 1)
        await dave.send(action="typing")
        await dave.until(lambda f: bool(f.errors))
        assert dave.frames.errors[0][0] == "room.read_only"
        await alice.assert_silent()
        assert typing_frames(alice) == []


async def test_a_non_member_is_refused(world: World) -> None:
    with pytest.raises(ClientError) as refused:
        await act(world.carol.pk, world.room.pk, "typing")
    assert refused.value.code == "room.forbidden"


async def test_nobody_is_typing_in_a_locked_room(world: World) -> None:
    await database_sync_to_async(Room.objects.filter(pk=world.room.pk).update)(status=Room.Status.LOCKED)
    before = dropped()
    async with member(world.alice) as alice, member(world.bob) as bob:
        await bob.send(action="typing")
        await bob.post("locked?")  # refused (room.locked): its error says the typing was handled
        await bob.until(lambda f: bool(f.errors))
        assert bob.frames.errors[0][0] == "room.locked"
        assert dropped() - before == 1  # handled before the post: dropped, never broadcast
        assert typing_frames(alice) == []
    assert await database_sync_to_async(Message.objects.count)() == 0
