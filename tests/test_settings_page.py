"""The room's settings page as owners and moderators use it, over HTTP, while the members
it acts on have the room open: a kick or a ban reaches their sockets (`room.removed`,
then 4403) and they cannot reconnect; unban lets them back in by the invite link; a role
change reaches every member list; each leaves one audit row with the request's address."""

from __future__ import annotations

import re
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.test import Client

from collab.chat.models import AuditEntry, Ban, Membership, Room
from tests.conftest import Member, World, connected, member
from tests.test_room_budget import admin_form

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("layer")]

ADDRESS = "198.51.100.23"


async def fetch(user: User, method: str, path: str, fields: dict[str, str] | None = None) -> Any:
    """`user`'s browser asks `path` (from the test's address)."""

    def ask() -> Any:
        client = Client(REMOTE_ADDR=ADDRESS)
        client.force_login(user)
        return client.get(path) if method == "get" else client.post(path, fields or {})

    return await database_sync_to_async(ask)()


async def submit(user: User, fields: dict[str, str], path: str = "/r/lab/settings/") -> Any:
    return await fetch(user, "post", path, fields)


async def closed_after(tab: Member, code: str) -> None:
    """The tab is told `code`, then its socket closes with 4403."""
    await tab.until(lambda f: bool(f.errors), timeout=5)
    assert tab.frames.errors[-1][0] == code
    assert (await tab.comm.receive_output(timeout=2)) == {"type": "websocket.close", "code": 4403}


async def refused_on_reconnect(user: User) -> None:
    async with connected(user, "lab") as (ok, _code, again):
        assert ok
        assert (await again.comm.receive_output(timeout=2)) == {"type": "websocket.close", "code": 4403}


def audit() -> list[tuple[str, str, str, str, str | None]]:
    return [
        (e.actor_name, e.action, e.room_name, e.target_name, e.address) for e in AuditEntry.objects.order_by("at", "id")
    ]


async def make_moderator(world: World) -> User:
    dave = await database_sync_to_async(User.objects.create_user)("dave", password="pw-dave-123")
    await database_sync_to_async(Membership.objects.create)(room=world.room, user=dave, role=Membership.Role.MODERATOR)
    return dave


@pytest.mark.parametrize("by", ["owner", "moderator"])
async def test_kick_from_the_page_closes_the_members_sockets(world: World, by: str) -> None:
    actor = world.alice if by == "owner" else await make_moderator(world)
    async with member(world.bob) as bob, member(world.alice) as alice:
        response = await submit(actor, {"op": "kick", "username": "bob"})
        assert response.status_code == 302 and response["Location"] == "/r/lab/settings/"
        await closed_after(bob, "room.removed")
        # the others' member lists drop bob
        await alice.until(lambda f: any('id="members"' in r and 'data-user="bob"' not in r for r in alice.raw[1:]))
    await refused_on_reconnect(world.bob)
    assert not await database_sync_to_async(Membership.objects.filter(user=world.bob).exists)()
    assert await database_sync_to_async(audit)() == [(actor.username, "kick", "lab", "bob", ADDRESS)]


async def test_ban_from_the_page_closes_the_socket_and_bars_the_invite(world: World) -> None:
    async with member(world.bob) as bob:
        response = await submit(world.alice, {"op": "ban", "username": "bob", "reason": "spam, twice"})
        assert response.status_code == 302
        await closed_after(bob, "room.removed")
    assert "may not rejoin" in bob.frames.errors[-1][1]
    await refused_on_reconnect(world.bob)
    ban = await database_sync_to_async(Ban.objects.select_related("user", "by").get)()
    assert (ban.user.username, ban.by.username if ban.by else None, ban.reason) == ("bob", "alice", "spam, twice")
    assert await database_sync_to_async(audit)() == [("alice", "ban", "lab", "bob", ADDRESS)]
    invite = f"/join/{world.room.invite_token}/"
    for method in ("get", "post"):
        page = await fetch(world.bob, method, invite)
        body = page.content.decode()
        assert page.status_code == 403 and "You were banned from Lab" in body and "ask its owner" in body
        assert "<form" not in body.split("<main>")[1]  # no join form
    assert not await database_sync_to_async(Membership.objects.filter(user=world.bob).exists)()


async def test_unban_from_the_page_lets_the_invite_work_again(world: World) -> None:
    await submit(world.alice, {"op": "ban", "username": "bob"})
    page = await fetch(world.alice, "get", "/r/lab/settings/")
    banned = page.content.decode().split('id="bans"')[1]
    assert 'data-user="bob"' in banned and 'value="unban"' in banned
    response = await submit(world.alice, {"op": "unban", "username": "bob"})
    assert response.status_code == 302
    assert not await database_sync_to_async(Ban.objects.exists)()
    joined = await fetch(world.bob, "post", f"/join/{world.room.invite_token}/")
    assert joined.status_code == 302 and joined["Location"] == "/r/lab/"
    async with member(world.bob) as bob:
        assert bob.frames.snapshots == 1
    actions = [row[1] for row in await database_sync_to_async(audit)()]
    assert actions == ["ban", "unban"]


AVATAR = re.compile(r'<span class="avatar[^>]*></span>')  # each member's avatar (chat/people.py)


def shows_moderator(tab: Member, name: str) -> bool:
    mark = rf'data-user="{name}"[^>]*>{name} <small class="role">\(moderator\)'
    return any(re.search(mark, AVATAR.sub("", frame)) for frame in tab.raw)


async def test_role_changes_reach_every_member_list(world: World) -> None:
    async with member(world.alice) as alice, member(world.bob) as bob:
        response = await submit(world.alice, {"op": "role", "username": "bob", "role": "moderator"})
        assert response.status_code == 302
        await alice.until(lambda f: shows_moderator(alice, "bob"))
        await bob.until(lambda f: shows_moderator(bob, "bob"))
        response = await submit(world.alice, {"op": "role", "username": "bob", "role": "member"})
        assert response.status_code == 302
        await bob.until(lambda f: re.search(r'data-user="bob"[^>]*>bob</li>', AVATAR.sub("", bob.raw[-1])) is not None)
    bobs = await database_sync_to_async(Membership.objects.get)(user=world.bob, room=world.room)
    assert bobs.role == Membership.Role.MEMBER
    rows = await database_sync_to_async(audit)()
    assert [(r[1], r[3], r[4]) for r in rows] == [("role", "bob", ADDRESS), ("role", "bob", ADDRESS)]
    details = await database_sync_to_async(
        lambda: list(AuditEntry.objects.order_by("id").values_list("detail", flat=True))
    )()
    assert details == ["member -> moderator", "moderator -> member"]


async def test_lock_from_the_page_reaches_the_room(world: World) -> None:
    async with member(world.bob) as bob:
        response = await submit(world.alice, {"op": "lock"})
        assert response.status_code == 302
        await bob.until(lambda f: any('data-status="locked"' in r for r in bob.raw[1:]))
        await bob.post("may I?")
        await bob.until(lambda f: bool(f.errors))
        assert bob.frames.errors[-1][0] == "room.locked"
        response = await submit(world.alice, {"op": "unlock"})
        assert response.status_code == 302
        await bob.until(lambda f: 'data-status="open"' in bob.raw[-1])
    status = await database_sync_to_async(Room.objects.values_list("status", flat=True).get)(pk=world.room.pk)
    assert status == "open"
    assert [r[1] for r in await database_sync_to_async(audit)()] == ["lock", "unlock"]


# --- renaming the room ------------------------------------------------------------------------


def settings_form(**fields: str) -> dict[str, str]:
    """The owner's settings form as the page sends it, with `fields` changed."""
    return {"op": "settings", "name": "Lab", "topic": "testing", "reply_to_all": "", "system_prompt": "", **fields}


def room_name() -> str:
    return Room.objects.values_list("name", flat=True).get(slug="lab")


async def test_the_owner_renames_the_room_and_open_pages_see_it(world: World) -> None:
    async with member(world.bob) as bob:
        response = await submit(world.alice, settings_form(name="  Lab, second floor  "))
        assert response.status_code == 302 and response["Location"] == "/r/lab/"
        # The heading and the title, on the page of a member who has the room open.
        await bob.until(lambda f: any('id="room-name"' in r for r in bob.raw[1:]))
        frame = next(r for r in bob.raw[1:] if 'id="room-name"' in r)
        assert '<h1 id="room-name" hx-swap-oob="true">Lab, second floor</h1>' in frame
        assert '<span hx-swap-oob="innerHTML:title">Lab, second floor · collab</span>' in frame
    assert await database_sync_to_async(room_name)() == "Lab, second floor"
    rows = await database_sync_to_async(lambda: list(AuditEntry.objects.values_list("action", "detail", "address")))()
    assert rows == [("rename", "Lab -> Lab, second floor", ADDRESS)]
    # A page opened (or reconnected) later has it in its snapshot; the room page, in its heading.
    async with member(world.bob) as again:
        assert '<h1 id="room-name" hx-swap-oob="true">Lab, second floor</h1>' in again.raw[0]
    page = (await fetch(world.bob, "get", "/r/lab/")).content.decode()
    assert '<h1 id="room-name">Lab, second floor</h1>' in page and "<title>Lab, second floor · collab</title>" in page
    # Saved again unchanged: nothing to audit.
    assert (await submit(world.alice, settings_form(name="Lab, second floor"))).status_code == 302
    assert await database_sync_to_async(AuditEntry.objects.count)() == 1


@pytest.mark.parametrize("role", ["moderator", "member"])
async def test_a_forged_rename_by_anyone_but_the_owner_is_refused(world: World, role: str) -> None:
    actor = await make_moderator(world) if role == "moderator" else world.bob
    response = await submit(actor, settings_form(name="Taken over"))
    assert response.status_code == 403
    assert await database_sync_to_async(room_name)() == "Lab"
    assert not await database_sync_to_async(AuditEntry.objects.exists)()


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("   ", "This field is required."),
        ("x" * 101, "at most 100 characters"),
        ("!!!", "at least one letter or digit"),
    ],
)
async def test_a_name_must_be_a_name(world: World, name: str, error: str) -> None:
    response = await submit(world.alice, settings_form(name=name))
    assert response.status_code == 400 and error in response.content.decode()
    assert await database_sync_to_async(room_name)() == "Lab"
    assert not await database_sync_to_async(AuditEntry.objects.exists)()


async def test_a_form_without_a_name_leaves_it(world: World) -> None:
    """A settings form made before the room's name was on it changes the rest, not the name."""
    fields = settings_form(topic="new topic")
    del fields["name"]
    assert (await submit(world.alice, fields)).status_code == 302
    assert await database_sync_to_async(room_name)() == "Lab"


async def test_staff_rename_in_the_admin_audited_and_live(world: World) -> None:
    root = await database_sync_to_async(User.objects.create_superuser)("root", password="pw-root-123")

    def rename_in_admin() -> int:
        client = Client(REMOTE_ADDR=ADDRESS)
        client.force_login(root)
        room = Room.objects.get(pk=world.room.pk)
        return client.post(
            f"/admin/chat/room/{room.pk}/change/", admin_form(client, room, name="Lab (archive)")
        ).status_code

    async with member(world.bob) as bob:
        assert await database_sync_to_async(rename_in_admin)() == 302
        await bob.until(
            lambda f: any('<h1 id="room-name" hx-swap-oob="true">Lab (archive)</h1>' in r for r in bob.raw[1:])
        )
    rows = await database_sync_to_async(
        lambda: list(AuditEntry.objects.values_list("actor_name", "action", "detail"))
    )()
    assert rows == [("root", "rename", "Lab -> Lab (archive)")]
