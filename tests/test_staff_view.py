"""Staff see any room as its members do, live and read-only, without joining it: the
page (no composer, a Join button), the socket (the snapshot and every live frame; each
action refused with `room.read_only`, nothing stored), and no trace in the member list
or presence. Joining stays an explicit act. Non-staff non-members still get a 404."""

from __future__ import annotations

import re
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType
from django.test import Client

from collab.chat import shared
from collab.chat.models import AuditEntry, Ban, Membership, Message, Room
from collab.chat.services import moderation
from collab.loadtest.wire import members
from tests.conftest import World, all_final, connected, member

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("replies_idle")]


@pytest.fixture
def dave(world: World) -> User:
    """Staff, not a member of the room."""
    return User.objects.create_user("dave", password="pw-dave-123", is_staff=True)


def browser(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def listed(frame: str) -> dict[str, bool]:
    return dict(members(frame))


def test_the_room_page_read_only_for_staff(world: World, dave: User) -> None:
    Message.objects.create(
        room=world.room,
        seq=1,
        role="user",
        author=world.bob,
        author_name="bob",
        text="hello all",
        html="<p>hello all</p>",
    )
    Room.objects.filter(pk=world.room.pk).update(last_seq=1)
    page = browser(dave).get("/r/lab/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "hello all" in html and 'data-seq="1"' in html  # the messages, as members see them
    assert 'ws-connect="/ws/rooms/lab/"' in html  # live
    assert 'id="composer"' not in html and "ws-send" not in html.split('id="messages"')[0]
    assert "You are viewing as staff, read-only" in html
    assert re.search(r'<form method="post" action="/r/lab/join/"[^>]*>.*?<button type="submit">Join</button>', html)
    assert set(listed(html)) == {"alice", "bob"}  # not dave
    assert "Leave room" not in html and "Room settings" not in html and "Invite link" not in html
    assert not Membership.objects.filter(user=dave).exists()  # viewing is not joining
    # the page's other reads: older messages and a whole message
    viewer = browser(dave)
    assert viewer.get("/r/lab/older/?before=2").status_code == 200
    message_id = Message.objects.get(seq=1).pk
    assert viewer.get(f"/r/lab/m/{message_id}/").status_code == 200


def test_non_staff_non_members_still_get_404(world: World, dave: User) -> None:
    carol = browser(world.carol)
    for url in ("/r/lab/", "/r/lab/older/?before=5", "/r/lab/m/1/"):
        assert carol.get(url).status_code == 404
    assert carol.post("/r/lab/join/").status_code == 404  # the staff Join is no back door
    assert not Membership.objects.filter(user=world.carol).exists()


def test_staff_view_of_an_unknown_room_is_404(world: World, dave: User) -> None:
    assert browser(dave).get("/r/no-such-room/").status_code == 404


def test_join_is_explicit_and_makes_staff_a_member(world: World, dave: User) -> None:
    client = browser(dave)
    response = client.post("/r/lab/join/")
    assert response.status_code == 302 and response["Location"] == "/r/lab/"
    assert Membership.objects.get(room=world.room, user=dave).role == Membership.Role.MEMBER
    page = client.get("/r/lab/").content.decode()
    assert 'id="composer"' in page and "viewing as staff" not in page
    assert client.post("/r/lab/join/").status_code == 302  # again: nothing more
    assert Membership.objects.filter(room=world.room, user=dave).count() == 1


def test_join_refuses_a_banned_staff_user_and_an_archived_room(world: World, dave: User) -> None:
    Ban.objects.create(room=world.room, user=dave, by=world.alice)
    client = browser(dave)
    response = client.post("/r/lab/join/", follow=True)
    assert response.status_code == 403 and b'data-code="room.banned"' in response.content  # the ban page
    assert not Membership.objects.filter(user=dave).exists()
    Ban.objects.all().delete()
    Room.objects.filter(pk=world.room.pk).update(status=Room.Status.ARCHIVED)
    response = client.post("/r/lab/join/", follow=True)
    assert b"archived" in response.content
    assert not Membership.objects.filter(user=dave).exists()


def test_the_admin_view_on_site_link_opens_the_room(world: World, dave: User) -> None:
    assert world.room.get_absolute_url() == "/r/lab/"
    ct = ContentType.objects.get_for_model(Room)
    response = browser(dave).get(f"/admin/r/{ct.pk}/{world.room.pk}/")
    assert response.status_code == 302 and response["Location"].endswith("/r/lab/")


async def test_the_staff_socket_sees_the_room_live_and_is_nobody_in_it(world: World, dave: User) -> None:
    async with member(world.bob) as bob, connected(dave, "lab") as (ok, _code, staff):
        assert ok
        await staff.until(lambda f: f.snapshots == 1)
        snapshot = staff.raw[0] + "".join(staff.raw[1:])
        assert set(listed(snapshot)) == {"alice", "bob"}
        assert listed(snapshot)["bob"] is True
        assert dave.pk not in await shared.backend().online(world.room.pk)
        await bob.post("@a tell the staff something")
        await staff.until(lambda f: all_final(f, 1))
        (reply,) = [r for r in staff.frames.replies.values() if r.role == "assistant"]
        assert reply.pieces > 0 and reply.final_attrs["data-status"] == "done"  # live, piece by piece
        assert (reply.lost, reply.duplicated, reply.out_of_order) == (0, 0, 0)
        await bob.until(lambda f: all_final(f, 1))
        # nobody was ever shown dave: neither bob's frames nor the staff socket's own
        assert not any('data-user="dave"' in frame for frame in bob.raw + staff.raw)
        assert not staff.frames.errors


async def test_a_staff_socket_is_resynced_after_an_outage_and_counted_as_watching(world: World, dave: User) -> None:
    from collab.chat.lifecycle import runtime

    async with member(world.bob), connected(dave, "lab") as (ok, _code, staff):
        assert ok
        await staff.until(lambda f: f.snapshots == 1)
        status = runtime.status()
        assert status["watchers"] == {str(world.room.pk): 1}  # the live page's "staff watching"
        assert str(dave.pk) not in status["sockets"][str(world.room.pk)]  # not online
        await runtime._resync_sockets()  # what the heartbeat does once the layer is back
        await staff.until(lambda f: f.snapshots == 2)
    assert runtime.status()["watchers"] == {}


ACTIONS: list[dict[str, Any]] = [
    {"text": "hello from staff", "client_id": "2b1c7e0e-7d0e-4a57-9d51-0c6a4c3b4d11"},
    {"action": "stop", "message_id": 1},
    {"action": "regenerate", "message_id": 1},
    {"action": "kick", "username": "bob"},
    {"action": "ban", "username": "bob", "reason": "staff"},
    {"action": "unban", "username": "carol"},
    {"action": "lock"},
    {"action": "unlock"},
    {"action": "stop_all"},
    {"action": "no-such-action"},
]


async def test_every_action_from_a_staff_socket_is_refused_and_nothing_stored(world: World, dave: User) -> None:
    await database_sync_to_async(Ban.objects.create)(room=world.room, user=world.carol, by=world.alice)
    async with member(world.bob) as bob, connected(dave, "lab") as (ok, _code, staff):
        assert ok
        await staff.until(lambda f: f.snapshots == 1)
        for content in ACTIONS:
            await staff.send(**content)
        await staff.comm.send_to(text_data="not json")
        await staff.until(lambda f: len(f.errors) == len(ACTIONS) + 1)
        assert {code for code, _ in staff.frames.errors} == {"room.read_only"}
        assert "join it to take part" in staff.frames.errors[0][1]
        await bob.assert_silent()  # nothing reached the room

    def state() -> tuple[int, list[tuple[str, str]], int, str, int]:
        room = Room.objects.get(pk=world.room.pk)
        roles = sorted(Membership.objects.filter(room=room).values_list("user__username", "role"))
        return Message.objects.count(), roles, Ban.objects.count(), room.status, AuditEntry.objects.count()

    assert await database_sync_to_async(state)() == (0, [("alice", "owner"), ("bob", "member")], 1, "open", 0)


async def test_closing_the_room_closes_the_staff_socket_too(world: World, dave: User) -> None:
    async with connected(dave, "lab") as (ok, _code, staff):
        assert ok
        await staff.until(lambda f: f.snapshots == 1)
        actor = moderation.Actor(world.alice, "203.0.113.9")  # the owner closes it
        await database_sync_to_async(moderation.close)(actor, world.room)
        await staff.until(lambda f: bool(f.errors))
        assert staff.frames.errors[-1][0] == "room.closed"
        assert (await staff.comm.receive_output(timeout=2))["code"] == 4403


async def test_a_non_staff_non_member_socket_is_still_closed_4403(world: World, dave: User) -> None:
    async with connected(world.carol, "lab") as (ok, _code, m):
        assert ok
        assert await m.comm.receive_output(timeout=2) == {"type": "websocket.close", "code": 4403}
