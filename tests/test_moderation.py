"""Roles in a room, over the socket (the moderation actions of docs/wire.md) and over
HTTP (the room's settings page): moderators kick, lock and stop any reply; plain members
are refused each (with its code, nothing changed, no audit row); a moderator cannot
remove another moderator or the owner; the owner sets roles."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from collab.chat.models import AuditEntry, Ban, Membership, Message, Room
from tests.conftest import Member, World, all_final, closed, reply_ids, session_cookie, stalling
from tests.test_admin_rooms import aaudit, acount, refused_at_connect, status_frames

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("replies_idle")]
live = pytest.mark.usefixtures("layer")
memory = pytest.mark.usefixtures("memory_layer")

BOB_ADDRESS = "10.0.0.2"  # the address bob's sockets come from (the scope's "client")


@pytest.fixture
def dave(world: World) -> User:
    """A second plain member of the room."""
    user = User.objects.create_user("dave", password="pw-dave-123")
    Membership.objects.create(room=world.room, user=user)
    return user


def make(room: Room, user: User, role: str) -> None:
    Membership.objects.filter(room=room, user=user).update(role=role)


amake = database_sync_to_async(make)


@contextlib.asynccontextmanager
async def socket(user: User, address: str = "10.0.0.9") -> AsyncIterator[Member]:
    """A member's socket in the room, past its snapshot, from `address`."""
    from collab.asgi import application

    cookie = await sync_to_async(session_cookie)(user)
    headers = [(b"origin", b"http://localhost"), (b"cookie", f"sessionid={cookie}".encode())]
    comm = WebsocketCommunicator(application, "/ws/rooms/lab/", headers=headers)
    comm.scope["client"] = [address, 50000]
    ok, _ = await comm.connect()
    assert ok
    m = Member(comm)
    try:
        await m.until(lambda f: f.snapshots >= 1)
        yield m
    finally:
        await comm.disconnect()


async def refused(m: Member, code: str, **frame: Any) -> None:
    """Send a frame; its answer is the error `code`, to this socket."""
    before = len(m.frames.errors)
    await m.send(**frame)
    await m.until(lambda f: len(f.errors) > before)
    assert m.frames.errors[-1][0] == code, m.frames.errors[-1]


def state() -> dict[str, object]:
    """What a refused action must leave as it was."""
    return {
        "members": sorted(Membership.objects.values_list("user__username", "role")),
        "status": list(Room.objects.values_list("slug", "status")),
        "bans": sorted(Ban.objects.values_list("user__username", flat=True)),
        "audit": AuditEntry.objects.count(),
        "replies": sorted(Message.objects.filter(role="assistant").values_list("status", flat=True)),
    }


astate = database_sync_to_async(state)


async def streaming_reply(asker: Member, question: str = "@a tell me everything") -> int:
    await asker.post(question)
    await asker.until(lambda f: any(r.pieces for r in f.replies.values() if r.role == "assistant"))
    return reply_ids(asker.frames)[-1]


# --- moderators, over the socket -----------------------------------------------------------------


@live
async def test_a_moderator_kicks_a_member_over_the_socket(world: World, dave: User) -> None:
    await amake(world.room, world.bob, Membership.Role.MODERATOR)
    async with socket(world.bob, BOB_ADDRESS) as bob, socket(dave) as dave_socket:
        await bob.send(action="kick", username="dave")
        assert await closed(dave_socket) == 4403
        assert dave_socket.frames.errors[-1][0] == "room.removed"
        assert bob.frames.errors == []
    assert await refused_at_connect(dave) == 4403
    assert await aaudit() == [("bob", "kick", "lab", "dave", BOB_ADDRESS)]


@memory
async def test_a_moderator_locks_and_unlocks_over_the_socket(world: World, dave: User) -> None:
    await amake(world.room, world.bob, Membership.Role.MODERATOR)
    async with socket(world.bob, BOB_ADDRESS) as bob, socket(dave) as dave_socket:
        await bob.send(action="lock")
        await dave_socket.until(lambda f: any('data-status="locked"' in x for x in status_frames(dave_socket)))
        await refused(dave_socket, "room.locked", text="hello?", client_id="6f1c1d2e-0d7e-4a43-9d64-8f3b2c1a0e11")
        assert await acount() == 0
        await bob.send(action="unlock")
        await dave_socket.until(lambda f: any('data-status="open"' in x for x in status_frames(dave_socket)))
    assert await aaudit() == [("bob", "lock", "lab", "", BOB_ADDRESS), ("bob", "unlock", "lab", "", BOB_ADDRESS)]


@memory
async def test_a_moderator_stops_another_members_reply(world: World, dave: User) -> None:
    await stalling(world)
    await amake(world.room, world.bob, Membership.Role.MODERATOR)
    async with socket(world.bob, BOB_ADDRESS) as bob, socket(dave) as dave_socket:
        reply_id = await streaming_reply(dave_socket)
        await bob.send(action="stop", message_id=reply_id)
        await dave_socket.until(lambda f: all_final(f, 1))
        assert bob.frames.errors == []
    reply = await database_sync_to_async(Message.objects.get)(pk=reply_id)
    assert reply.status == "stopped" and reply.text == dave_socket.frames.replies[reply_id].text != ""
    assert await aaudit() == [("bob", "stop_reply", "lab", "", BOB_ADDRESS)]  # the asker's own stop is not audited


@memory
async def test_a_moderator_stops_every_reply_over_the_socket(world: World, dave: User) -> None:
    await stalling(world)
    await amake(world.room, world.bob, Membership.Role.MODERATOR)
    async with socket(world.bob, BOB_ADDRESS) as bob, socket(dave) as dave_socket:
        await dave_socket.post("@a @b both of you")
        await dave_socket.until(lambda f: sum(1 for r in f.replies.values() if r.role == "assistant" and r.pieces) == 2)
        await bob.send(action="stop_all")
        await dave_socket.until(lambda f: all_final(f, 2))
    assert (await astate())["replies"] == ["stopped", "stopped"]
    assert await aaudit() == [("bob", "stop_all", "lab", "", BOB_ADDRESS)]


@memory
async def test_a_moderator_cannot_remove_another_moderator_or_the_owner(world: World, dave: User) -> None:
    await amake(world.room, world.bob, Membership.Role.MODERATOR)
    await amake(world.room, dave, Membership.Role.MODERATOR)
    before = await astate()
    async with socket(world.bob) as bob:
        await refused(bob, "room.not_allowed", action="kick", username="dave")
        await refused(bob, "room.not_allowed", action="ban", username="dave")
        await refused(bob, "member.is_owner", action="kick", username="alice")
        await refused(bob, "member.is_owner", action="ban", username="alice")
    assert await astate() == before


@memory
async def test_moderation_frames_with_bad_input_get_clear_errors(world: World) -> None:
    await amake(world.room, world.bob, Membership.Role.MODERATOR)
    async with socket(world.alice) as alice, socket(world.bob) as bob:
        await refused(alice, "member.invalid", action="kick")
        await refused(alice, "member.invalid", action="kick", username=5)
        await refused(alice, "member.not_found", action="kick", username="nobody")
        await refused(alice, "member.not_banned", action="unban", username="carol")
        await refused(alice, "member.is_owner", action="kick", username="alice")
        await refused(bob, "member.is_self", action="kick", username="bob")
    assert await aaudit() == []


# --- plain members, over the socket: a test per action -------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        {"action": "kick", "username": "dave"},
        {"action": "ban", "username": "dave"},
        {"action": "unban", "username": "carol"},
        {"action": "lock"},
        {"action": "unlock"},
        {"action": "stop_all"},
    ],
    ids=lambda f: str(f["action"]),
)
@memory
async def test_a_member_cannot_moderate_over_the_socket(world: World, dave: User, frame: dict[str, str]) -> None:
    def setup() -> None:
        Ban.objects.create(room=world.room, user=world.carol)
        if frame["action"] == "unlock":
            Room.objects.filter(pk=world.room.pk).update(status=Room.Status.LOCKED)

    await database_sync_to_async(setup)()
    before = await astate()
    async with socket(world.bob) as bob, socket(dave) as dave_socket:
        await refused(bob, "room.not_allowed", **frame)
        await dave_socket.assert_silent()  # nobody was kicked, nothing changed for the room
    assert await astate() == before


@memory
async def test_a_member_cannot_stop_another_members_reply(world: World) -> None:
    await stalling(world)
    async with socket(world.alice) as alice, socket(world.bob) as bob:
        reply_id = await streaming_reply(alice)
        await refused(bob, "reply.forbidden", action="stop", message_id=reply_id)
        await refused(bob, "room.not_allowed", action="stop_all")
        assert (await astate())["replies"] == ["streaming"]
        assert not alice.frames.replies[reply_id].final_attrs  # still streaming
        await alice.send(action="stop", message_id=reply_id)  # the asker may
        await alice.until(lambda f: all_final(f, 1))
    assert await aaudit() == []


# --- over HTTP: the room's settings page -----------------------------------------------------------


def settings_post(user: User, **data: str) -> Any:
    client = Client()
    client.force_login(user)
    return client.post("/r/lab/settings/", data)


asettings_post = sync_to_async(settings_post)


@live
async def test_a_moderator_kicks_over_http_and_the_socket_closes(world: World, dave: User) -> None:
    await amake(world.room, world.bob, Membership.Role.MODERATOR)
    async with socket(dave) as dave_socket:
        response = await asettings_post(world.bob, op="kick", username="dave")
        assert response.status_code == 302
        assert await closed(dave_socket) == 4403
        assert dave_socket.frames.errors[-1][0] == "room.removed"
    assert await aaudit() == [("bob", "kick", "lab", "dave", "127.0.0.1")]


@memory
async def test_a_moderator_locks_over_http(world: World, dave: User) -> None:
    await amake(world.room, world.bob, Membership.Role.MODERATOR)
    async with socket(dave) as dave_socket:
        assert (await asettings_post(world.bob, op="lock")).status_code == 302
        await dave_socket.until(lambda f: any('data-status="locked"' in x for x in status_frames(dave_socket)))
    assert await aaudit() == [("bob", "lock", "lab", "", "127.0.0.1")]


@pytest.mark.parametrize(
    "data",
    [
        {"op": "kick", "username": "dave"},
        {"op": "ban", "username": "dave"},
        {"op": "lock"},
        {"op": "role", "username": "dave", "role": "moderator"},
    ],
    ids=lambda d: d["op"],
)
@memory
def test_a_member_cannot_moderate_over_http(world: World, dave: User, data: dict[str, str]) -> None:
    before = state()
    assert settings_post(world.bob, **data).status_code == 403
    assert state() == before


@memory
def test_a_moderator_cannot_set_roles_over_http(world: World, dave: User) -> None:
    make(world.room, world.bob, Membership.Role.MODERATOR)
    before = state()
    assert settings_post(world.bob, op="role", username="dave", role="moderator").status_code == 403
    assert state() == before


@memory
async def test_the_owner_sets_roles_and_the_room_sees_them(world: World, dave: User) -> None:
    async with socket(dave) as dave_socket:
        response = await asettings_post(world.alice, op="role", username="bob", role="moderator")
        assert response.status_code == 302
        await dave_socket.until(lambda f: any('data-user="bob"' in x and "moderator" in x for x in dave_socket.raw[1:]))
    role = await database_sync_to_async(lambda: Membership.objects.get(user=world.bob).role)()
    assert role == "moderator"
    # and now bob may moderate: a kick over the socket works
    async with socket(world.bob, BOB_ADDRESS) as bob, socket(dave) as dave_socket:
        await bob.send(action="kick", username="dave")
        assert await closed(dave_socket) == 4403
    assert await aaudit() == [("alice", "role", "lab", "bob", "127.0.0.1"), ("bob", "kick", "lab", "dave", BOB_ADDRESS)]
