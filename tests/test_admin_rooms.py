"""The admin's rooms, memberships and bans, driven through the admin's own URLs by a
staff client while real WebSocket clients are connected: the effect of each action on
those clients, on what is stored, and the one audit row it leaves."""

from __future__ import annotations

import io
import json
import zipfile
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.http import HttpResponse
from django.test import Client
from django.test.utils import CaptureQueriesContext

from collab.chat.admin.rooms import month_start
from collab.chat.models import AuditEntry, Ban, Membership, Message, Room
from tests.conftest import Member, World, all_final, closed, connected, member, reply_ids, stalling

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("replies_idle")]
live = pytest.mark.usefixtures("layer")  # in memory, and on Redis (both channel layers)
memory = pytest.mark.usefixtures("memory_layer")

ADDRESS = "127.0.0.1"  # the test client's REMOTE_ADDR


@pytest.fixture
def root(world: World) -> User:
    return User.objects.create_user("root", password="pw-root-123", is_staff=True, is_superuser=True)


@pytest.fixture
def staff(root: User) -> Client:
    client = Client()
    client.force_login(root)
    return client


def act(client: Client, model: str, action: str, *pks: int, follow: bool = True, **extra: str) -> Any:
    """An admin action from a changelist: what the action select and the checkboxes post."""
    data = {"action": action, "_selected_action": [str(pk) for pk in pks], **extra}
    return client.post(f"/admin/chat/{model}/", data, follow=follow)


aact = sync_to_async(act)


def notices(response: Any) -> list[tuple[str, str]]:
    """The admin's messages on the page: (level, text)."""
    return [(m.level_tag, str(m)) for m in response.context["messages"]]


def audit() -> list[tuple[str, str, str, str, str | None]]:
    rows = AuditEntry.objects.order_by("id").values_list("actor_name", "action", "room_name", "target_name", "address")
    return list(rows)


aaudit = database_sync_to_async(audit)


def count_messages() -> int:
    return Message.objects.count()


acount = database_sync_to_async(count_messages)


def membership_pk(room: Room, user: User) -> int:
    return Membership.objects.get(room=room, user=user).pk


async def refused_at_connect(user: User, slug: str = "lab") -> int:
    async with connected(user, slug) as (ok, _code, m):
        assert ok  # accepted, then closed: the page can tell "not allowed" from trouble
        out = await m.comm.receive_output(timeout=5)
        assert out["type"] == "websocket.close"
        return int(out["code"])


def status_frames(m: Member) -> list[str]:
    return [f for f in m.raw if 'id="room-status"' in f]


# --- the room list ----------------------------------------------------------------------------


def _stored(room: Room, seq: int, role: str = "user", **kw: Any) -> Message:
    Room.objects.filter(pk=room.pk).update(last_seq=seq)
    return Message.objects.create(room=room, seq=seq, role=role, author_name=kw.pop("author_name", "alice"), **kw)


def _figures(world: World) -> Room:
    """Lab: 3 messages this month (1 streaming), 1 last month; 'other': nothing."""
    room = world.room
    _stored(room, 1, text="old question")
    old = _stored(room, 2, "assistant", text="old", tokens=100, prompt_tokens=1000, cost=Decimal("9"))
    last_month = month_start() - timedelta(days=3)
    Message.objects.filter(pk=old.pk).update(created_at=last_month)
    _stored(room, 3, text="q")
    _stored(room, 4, "assistant", text="a", tokens=20, prompt_tokens=200, cost=Decimal("0.25"), status="done")
    _stored(room, 5, "assistant", text="so far", tokens=None, prompt_tokens=300, status="streaming")
    other = Room.objects.create(name="Other", slug="other", owner=world.bob)
    Membership.objects.create(room=other, user=world.bob, role=Membership.Role.OWNER)
    return other


def _cells(html: str, slug: str) -> dict[str, str]:
    """The changelist row of a room, as {column class: text}."""
    import re

    row = next(r for r in re.findall(r"<tr>(.*?)</tr>", html, re.S) if f">{slug}<" in r)
    return {
        name: re.sub(r"<[^>]+>", "", text).strip()
        for name, text in re.findall(r'<t[dh] class="field-([\w-]+)[^"]*"[^>]*>(.*?)</t[dh]>', row, re.S)
    }


@live  # "online now" from the shared state: this process's memory, or Redis
async def test_room_list_shows_each_rooms_figures(world: World, staff: Client) -> None:
    await database_sync_to_async(_figures)(world)
    async with member(world.bob), member(world.bob):  # two tabs: one member online
        response = await sync_to_async(staff.get)("/admin/chat/room/")
    assert response.status_code == 200
    html = response.content.decode()
    lab, other = _cells(html, "lab"), _cells(html, "other")
    assert lab["room_status"] == "open"
    assert (lab["member_count"], lab["online_now"], lab["message_count"], lab["streaming_count"]) == (
        "2",
        "1",
        "5",
        "1",
    )
    assert lab["tokens_this_month"] == str(20 + 200 + 300)  # last month's reply not counted
    assert lab["cost_this_month"] == "0.2500"
    assert lab["last_activity"] != "never"
    assert (other["member_count"], other["online_now"], other["message_count"]) == ("1", "0", "0")
    assert (other["tokens_this_month"], other["cost_this_month"], other["last_activity"]) == ("0", "0.0000", "never")
    # The way to the live page and to usage.
    assert 'href="/admin/chat/room/live/"' in html and 'href="/admin/chat/room/usage/"' in html


def _list_queries(client: Client, rooms: int, owner: User) -> int:
    for i in range(Room.objects.count(), rooms):
        room = Room.objects.create(name=f"R{i}", slug=f"r{i}", owner=owner)
        Membership.objects.create(room=room, user=owner, role=Membership.Role.OWNER)
        Message.objects.create(room=room, seq=1, role="user", author_name="x", text="hi", tokens=1, cost=Decimal(1))
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/admin/chat/room/").status_code == 200
    return len(queries)


@memory
def test_room_list_is_a_few_queries_whatever_its_length(world: World, staff: Client) -> None:
    few = _list_queries(staff, 2, world.alice)
    many = _list_queries(staff, 30, world.alice)
    assert few == many <= 8


@memory
def test_room_list_filters_and_search(world: World, staff: Client) -> None:
    other = _figures(world)
    Room.objects.filter(pk=other.pk).update(status=Room.Status.LOCKED)

    def slugs(query: str) -> set[str]:
        return {r.slug for r in staff.get(f"/admin/chat/room/{query}").context["cl"].result_list}

    assert slugs("") == {"lab", "other"}
    assert slugs("?status__exact=locked") == {"other"}
    assert slugs("?streaming=yes") == {"lab"}
    assert slugs("?streaming=no") == {"other"}
    assert slugs("?active=1") == {"lab"}
    assert slugs("?q=bob") == {"other"}  # the owner's username
    assert slugs("?q=Lab") == {"lab"}
    for column in range(12):  # every sortable column sorts (the figures are annotations)
        assert staff.get(f"/admin/chat/room/?o={column}").status_code == 200
    by_messages = [r.slug for r in staff.get("/admin/chat/room/?o=-7").context["cl"].result_list]  # 0: the checkbox
    assert by_messages == ["lab", "other"]


@memory
def test_a_room_added_in_the_admin_has_its_owner_as_member(world: World, staff: Client) -> None:
    data = {"name": "New", "slug": "new", "topic": "", "owner": world.bob.pk}
    data |= {"voters": "members", "approval": "voters", "rejected_left_out": "on"}  # the form's defaults (votes)
    assert staff.post("/admin/chat/room/add/", data).status_code == 302
    room = Room.objects.get(slug="new")
    assert (room.status, list(room.memberships.values_list("user__username", "role"))) == ("open", [("bob", "owner")])


@memory
def test_status_is_read_only_in_the_room_form(world: World, staff: Client) -> None:
    page = staff.get(f"/admin/chat/room/{world.room.pk}/change/").content.decode()
    assert 'name="status"' not in page
    assert 'name="memberships-0-role"' not in page  # roles change through actions only
    assert 'data-action="lock"' in page  # the room's own buttons


# --- room actions -------------------------------------------------------------------------------


@live
async def test_lock_refuses_posts_and_unlock_restores_them(world: World, staff: Client) -> None:
    async with member(world.alice) as alice, member(world.bob) as bob:
        response = await aact(staff, "room", "lock", world.room.pk)
        assert ("success", "Locked: lab.") in notices(response)
        await alice.until(lambda f: any('data-status="locked"' in s for s in status_frames(alice)))
        await bob.until(lambda f: any('data-status="locked"' in s for s in status_frames(bob)))
        await bob.post("anyone there?")
        await bob.until(lambda f: bool(f.errors))
        assert bob.frames.errors[-1][0] == "room.locked"
        assert await acount() == 0
        await aact(staff, "room", "unlock", world.room.pk)
        await bob.until(lambda f: any('data-status="open"' in s for s in status_frames(bob)))
        await bob.post("back again")
        await alice.until(lambda f: bool(reply_ids(f, "user")))
    assert await acount() == 1
    assert await aaudit() == [("root", "lock", "lab", "", ADDRESS), ("root", "unlock", "lab", "", ADDRESS)]


@memory
async def test_archive_hides_the_room_and_refuses_posts(world: World, staff: Client) -> None:
    bob_client = Client()
    await sync_to_async(bob_client.force_login)(world.bob)
    assert b'href="/r/lab/"' in (await sync_to_async(bob_client.get)("/")).content
    async with member(world.bob) as bob:
        await aact(staff, "room", "archive", world.room.pk)
        await bob.until(lambda f: any('data-status="archived"' in s for s in status_frames(bob)))
        await bob.post("still here?")
        await bob.until(lambda f: bool(f.errors))
        assert bob.frames.errors[-1][0] == "room.archived"
    assert b'href="/r/lab/"' not in (await sync_to_async(bob_client.get)("/")).content
    assert await acount() == 0
    await aact(staff, "room", "unarchive", world.room.pk)
    assert b'href="/r/lab/"' in (await sync_to_async(bob_client.get)("/")).content
    assert await aaudit() == [("root", "archive", "lab", "", ADDRESS), ("root", "unarchive", "lab", "", ADDRESS)]


@live
async def test_close_disconnects_every_socket(world: World, staff: Client) -> None:
    async with member(world.alice) as alice, member(world.bob) as bob, member(world.bob) as bob2:
        await aact(staff, "room", "close", world.room.pk)
        for m in (alice, bob, bob2):
            assert await closed(m) == 4403
            assert m.frames.errors[-1][0] == "room.closed"
    async with member(world.bob):  # the room stays as it was: members come back
        pass
    assert await aaudit() == [("root", "close", "lab", "", ADDRESS)]


@live
async def test_stop_all_stops_every_streaming_reply_and_keeps_its_text(world: World, staff: Client) -> None:
    await stalling(world)  # replies still streaming whenever the staff acts
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.post("@a @b tell us everything")
        await alice.until(lambda f: sum(1 for r in f.replies.values() if r.role == "assistant" and r.pieces) == 2)
        response = await aact(staff, "room", "stop_all", world.room.pk)
        assert ("success", "Stopped every reply streaming in: lab.") in notices(response)
        for m in (alice, bob):
            await m.until(lambda f: all_final(f, 2))
    stored = await database_sync_to_async(list)(Message.objects.filter(role="assistant").order_by("seq"))
    assert [r.status for r in stored] == ["stopped", "stopped"]
    for reply in stored:
        assert reply.text and reply.text == alice.frames.replies[reply.pk].text
    assert await aaudit() == [("root", "stop_all", "lab", "", ADDRESS)]


@memory
def test_export_holds_each_rooms_transcript(world: World, staff: Client) -> None:
    other = _figures(world)
    Message.objects.create(room=other, seq=1, role="user", author_name="bob", text="in the other room")
    response = act(staff, "room", "export", world.room.pk, other.pk, follow=False)
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    assert "attachment" in response["Content-Disposition"]
    archive = zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content)))
    assert sorted(archive.namelist()) == ["lab.jsonl", "lab.md", "other.jsonl", "other.md"]
    lines = [json.loads(x) for x in archive.read("lab.jsonl").decode().splitlines()]
    stored = list(Message.objects.filter(room=world.room).order_by("seq"))
    assert [(x["seq"], x["author"], x["role"], x["status"], x["text"]) for x in lines] == [
        (m.seq, m.author_name, m.role, m.status, m.text) for m in stored
    ]
    assert lines[-1]["status"] == "streaming" and lines[-1]["text"] == "so far"  # the text stored so far
    assert all(x["time"] for x in lines)
    markdown = archive.read("lab.md").decode()
    assert markdown.startswith("# Lab (lab)")
    positions = [markdown.index(f"### #{m.seq} ") for m in stored]
    assert positions == sorted(positions)
    assert "streaming: the text so far" in markdown and "so far" in markdown
    assert [json.loads(x)["text"] for x in archive.read("other.jsonl").decode().splitlines()] == ["in the other room"]
    assert audit() == [("root", "export", "lab", "", ADDRESS), ("root", "export", "other", "", ADDRESS)]


@memory
def test_actions_on_many_rooms_and_refusals_are_errors_not_500s(world: World, staff: Client) -> None:
    other = _figures(world)
    Room.objects.filter(pk=other.pk).update(status=Room.Status.ARCHIVED)
    response = act(staff, "room", "lock", world.room.pk, other.pk)
    assert response.status_code == 200
    assert notices(response) == [
        ("error", "other: This room is archived: unarchive it first."),
        ("success", "Locked: lab."),
    ]
    assert dict(Room.objects.values_list("slug", "status")) == {"lab": "locked", "other": "archived"}
    response = act(staff, "room", "lock", world.room.pk)
    assert notices(response) == [("warning", "Already locked: lab.")]
    assert audit() == [("root", "lock", "lab", "", ADDRESS)]  # one row: the one change


@memory
def test_a_rooms_buttons_come_back_to_its_page(world: World, staff: Client) -> None:
    response = act(staff, "room", "lock", world.room.pk, follow=False, **{"from": "change"})
    assert response.status_code == 302 and response["Location"] == f"/admin/chat/room/{world.room.pk}/change/"
    page = staff.get(response["Location"]).content.decode()
    assert 'data-action="unlock"' in page and 'data-action="lock"' not in page


@memory
def test_staff_without_change_permission_cannot_act(world: World) -> None:
    viewer = User.objects.create_user("viewer", password="pw-viewer-123", is_staff=True)
    viewer.user_permissions.add(*Permission.objects.filter(codename__in=["view_room", "view_message"]))
    client = Client()
    client.force_login(viewer)
    response = act(client, "room", "lock", world.room.pk)
    assert response.status_code == 200
    assert "lock" not in [choice for choice, _ in response.context["action_form"].fields["action"].choices]
    assert Room.objects.get().status == "open" and audit() == []


@memory
def test_non_staff_get_nothing_from_the_actions(world: World) -> None:
    for user in (world.alice, world.bob):  # the room's owner too: the admin is for staff
        client = Client()
        client.force_login(user)
        for model, action, pk in [
            ("room", "close", world.room.pk),
            ("room", "export", world.room.pk),
            ("membership", "kick", membership_pk(world.room, world.bob)),
        ]:
            response = act(client, model, action, pk, follow=False)
            assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert Membership.objects.count() == 2 and audit() == []


# --- members --------------------------------------------------------------------------------------


@live
async def test_kick_closes_the_members_sockets_and_ends_the_membership(world: World, staff: Client) -> None:
    pk = await database_sync_to_async(membership_pk)(world.room, world.bob)
    async with member(world.alice) as alice, member(world.bob) as bob:
        response = await aact(staff, "membership", "kick", pk)
        assert ("success", "Kicked: bob in lab.") in notices(response)
        assert await closed(bob) == 4403
        assert bob.frames.errors[-1][0] == "room.removed"
        await alice.until(lambda f: any('id="members"' in x and 'data-user="bob"' not in x for x in alice.raw[1:]))
        await alice.assert_silent()  # alice stays
    assert await refused_at_connect(world.bob) == 4403
    assert not await database_sync_to_async(Membership.objects.filter(user=world.bob).exists)()
    assert await aaudit() == [("root", "kick", "lab", "bob", ADDRESS)]


def _invite(client: Client, room: Room, method: str) -> HttpResponse:
    url = f"/join/{room.invite_token}/"
    return client.post(url) if method == "post" else client.get(url)


@live
async def test_ban_bars_the_invite_link_until_unbanned(world: World, staff: Client) -> None:
    pk = await database_sync_to_async(membership_pk)(world.room, world.bob)
    async with member(world.bob) as bob:
        response = await aact(staff, "membership", "ban", pk)
        assert ("success", "Banned: bob in lab.") in notices(response)
        assert await closed(bob) == 4403
        assert bob.frames.errors[-1][0] == "room.removed"
    assert await refused_at_connect(world.bob) == 4403
    bob_client = Client()
    await sync_to_async(bob_client.force_login)(world.bob)
    for method in ("get", "post"):
        page = await sync_to_async(_invite)(bob_client, world.room, method)
        assert page.status_code == 403 and b"banned" in page.content
    assert not await database_sync_to_async(Membership.objects.filter(user=world.bob).exists)()
    ban = await database_sync_to_async(Ban.objects.get)(user=world.bob)
    deleted = await sync_to_async(staff.post)(f"/admin/chat/ban/{ban.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 302
    joined = await sync_to_async(_invite)(bob_client, world.room, "post")
    assert joined.status_code == 302 and joined["Location"] == "/r/lab/"
    async with member(world.bob):
        pass
    assert await aaudit() == [("root", "ban", "lab", "bob", ADDRESS), ("root", "unban", "lab", "bob", ADDRESS)]


@live
async def test_adding_a_ban_in_the_admin_kicks_the_member_live(world: World, staff: Client) -> None:
    async with member(world.bob) as bob:
        data = {"room": world.room.pk, "user": world.bob.pk, "reason": "spam"}
        response = await sync_to_async(staff.post)("/admin/chat/ban/add/", data)
        assert response.status_code == 302
        assert await closed(bob) == 4403
        assert bob.frames.errors[-1][0] == "room.removed"
    ban = await database_sync_to_async(Ban.objects.select_related("by").get)()
    assert (ban.user_id, ban.by.username if ban.by else None, ban.reason) == (world.bob.pk, "root", "spam")
    entries = await database_sync_to_async(list)(AuditEntry.objects.values_list("action", "target_name", "detail"))
    assert entries == [("ban", "bob", "spam")]


@memory
def test_a_ban_the_rules_refuse_is_a_form_error(world: World, staff: Client) -> None:
    response = staff.post("/admin/chat/ban/add/", {"room": world.room.pk, "user": world.alice.pk})
    assert response.status_code == 200  # the form again, with the reason
    assert "The room&#x27;s owner cannot be removed or banned." in response.content.decode()
    assert not Ban.objects.exists() and audit() == []


@memory
def test_bulk_unban_goes_through_moderation(world: World, staff: Client) -> None:
    dave = User.objects.create_user("dave")
    bans = [Ban.objects.create(room=world.room, user=u) for u in (world.carol, dave)]
    response = act(staff, "ban", "delete_selected", *(b.pk for b in bans), post="yes")
    assert response.status_code == 200
    assert not Ban.objects.exists()
    assert sorted(audit()) == [("root", "unban", "lab", "carol", ADDRESS), ("root", "unban", "lab", "dave", ADDRESS)]


@memory
async def test_roles_change_through_the_membership_actions(world: World, staff: Client) -> None:
    pk = await database_sync_to_async(membership_pk)(world.room, world.bob)
    async with member(world.alice) as alice:
        response = await aact(staff, "membership", "make_moderator", pk)
        assert ("success", "Now moderators: bob in lab.") in notices(response)
        await alice.until(lambda f: any('data-user="bob"' in x and "moderator" in x for x in alice.raw[1:]))
    assert await database_sync_to_async(lambda: Membership.objects.get(pk=pk).role)() == "moderator"
    response = await aact(staff, "membership", "make_moderator", pk)  # again: nothing to do
    assert notices(response) == [("warning", "Unchanged (already so): bob in lab.")]
    await aact(staff, "membership", "make_member", pk)
    owner = await database_sync_to_async(membership_pk)(world.room, world.alice)
    response = await aact(staff, "membership", "make_member", owner)
    assert notices(response) == [("error", "alice in lab: The room's owner cannot be given another role.")]
    rows = await database_sync_to_async(list)(AuditEntry.objects.order_by("id").values_list("action", "detail"))
    assert rows == [("role", "member -> moderator"), ("role", "moderator -> member")]


@memory
def test_membership_admin_lists_filters_and_cannot_add_or_delete(world: World, staff: Client) -> None:
    response = staff.get("/admin/chat/membership/?role__exact=owner")
    assert [(m.room.slug, m.user.username) for m in response.context["cl"].result_list] == [("lab", "alice")]
    response = staff.get("/admin/chat/membership/?q=bob")
    assert [m.user.username for m in response.context["cl"].result_list] == ["bob"]
    assert staff.get("/admin/chat/membership/add/").status_code == 403
    pk = membership_pk(world.room, world.bob)
    assert staff.post(f"/admin/chat/membership/{pk}/delete/", {"post": "yes"}).status_code == 403
    staff.post(f"/admin/chat/membership/{pk}/change/", {"role": "owner"})
    assert Membership.objects.get(pk=pk).role == "member" and audit() == []


# --- deleting: rooms close their sockets first; messages are read-only, deletions audited ------


@live
async def test_deleting_a_room_closes_its_sockets_and_leaves_one_audit_row(world: World, staff: Client) -> None:
    async with member(world.alice) as alice, member(world.bob) as bob:
        response = await aact(staff, "room", "delete_selected", world.room.pk, post="yes")
        assert response.status_code == 200
        for m in (alice, bob):
            assert await closed(m) == 4403
            assert m.frames.errors[-1][0] == "room.closed"
    assert not await Room.objects.filter(pk=world.room.pk).aexists()
    assert await aaudit() == [("root", "delete", "lab", "", ADDRESS)]


@memory
def test_messages_are_read_only_in_the_admin_and_a_deletion_is_audited(world: World, staff: Client) -> None:
    message = _stored(world.room, 1, text="a thing said")
    page = staff.get(f"/admin/chat/message/{message.pk}/change/")
    assert page.status_code == 200 and b'name="text"' not in page.content  # shown, not editable
    refused = staff.post(f"/admin/chat/message/{message.pk}/change/", {"text": "rewritten"})
    assert refused.status_code == 403
    assert Message.objects.get(pk=message.pk).text == "a thing said"
    assert staff.get("/admin/chat/message/add/").status_code == 403
    response = staff.post(f"/admin/chat/message/{message.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not Message.objects.filter(pk=message.pk).exists()
    assert audit() == [("root", "message.delete", "lab", "", ADDRESS)]
