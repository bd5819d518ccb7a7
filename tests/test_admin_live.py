"""The admin's live page (collab/chat/admin/live.py): rendered while real sockets are
open and real replies stream (in-process members on the simulated model), its figures
are checked against the state the test set up; its buttons stop a reply, close and lock
a room, each with its audit row; non-staff get nothing. Two processes, and a browser:
tests/test_admin_live_cluster.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from html.parser import HTMLParser

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import Permission, User
from django.test import AsyncClient

from collab.chat import shared
from collab.chat.generation import registry
from collab.chat.lifecycle import runtime
from collab.chat.models import AuditEntry, Message, Room
from collab.chat.shared.base import STATUS_TTL_S
from collab.chat.shared.redis import RedisState
from tests.conftest import Member, World, closed, member

LIVE = "/admin/chat/room/live/"
FRAGMENT = LIVE + "fragment/"
HX = {"HX-Request": "true"}  # what htmx sends with each request
STALL = "sim+stall@20"  # 20 tokens, then silence until stopped: a reply that streams for as long as the test needs


class Fragment(HTMLParser):
    """The figures of the live fragment, from its data- attributes."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.html = html
        self.rooms: dict[str, dict[str, str]] = {}
        self.room_sockets: dict[str, dict[str, int]] = {}  # room -> process -> sockets
        self.replies: dict[int, dict[str, str]] = {}
        self.processes: dict[str, dict[str, str]] = {}
        self.notice = ""
        self._room = ""
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        data = {k[5:]: v or "" for k, v in attrs if k.startswith("data-")}
        if tag == "tr" and "reply" in data:
            self.replies[int(data["reply"])] = data
        elif tag == "tr" and "room" in data and "sockets" in data:
            self.rooms[data["room"]] = data
            self._room = data["room"]
        elif tag == "tr" and "process" in data:
            self.processes[data["process"]] = data
        elif tag == "li" and "room-process" in data:
            self.room_sockets.setdefault(self._room, {})[data["room-process"]] = int(data["sockets"])
        elif "notice" in data:
            self.notice = data["notice"]


# --- in one process: members and replies of this test -------------------------------------------


@pytest.fixture
async def staff(world: World) -> AsyncClient:
    def make() -> User:  # staff with the room permissions the page asks for, not a superuser
        root = User.objects.create_user("root", password="pw-root-123", is_staff=True)
        root.user_permissions.add(*Permission.objects.filter(codename__in=["view_room", "change_room"]))
        return root

    root = await database_sync_to_async(make)()
    client = AsyncClient()
    await client.aforce_login(root)
    return client


@pytest.fixture
async def stalls(world: World, replies_idle: None) -> AsyncIterator[None]:
    """The room's assistants stream 20 tokens and then wait (until stopped); whatever is
    still running at the end is stopped, before replies_idle waits for them."""
    world.provider.read_timeout_s = 60
    await database_sync_to_async(world.provider.save)()
    for assistant in world.assistants.values():
        assistant.model = STALL
        await database_sync_to_async(assistant.save)()
    yield
    for reply_id in registry.ids():
        registry.stop(reply_id)


async def fragment(client: AsyncClient) -> Fragment:
    response = await client.get(FRAGMENT)
    assert response.status_code == 200
    return Fragment(response.content.decode())


async def fragment_until(client: AsyncClient, done: Callable[[Fragment], bool], timeout: float = 15.0) -> Fragment:
    """Ask for the fragment until `done` holds (the page's own polling, faster)."""
    async with asyncio.timeout(timeout):
        while True:
            page = await fragment(client)
            if done(page):
                return page
            await asyncio.sleep(0.05)  # the next poll: the page itself asks every 2 s


def writing(page: Fragment, n: int = 1) -> bool:
    """At least `n` replies write, each with its 20 tokens."""
    return sum(r["state"] == "writing" and int(r["tokens"]) >= 20 for r in page.replies.values()) >= n


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("layer", "stalls")
async def test_the_live_page_counts_sockets_users_and_streaming_replies(world: World, staff: AsyncClient) -> None:
    page = await fragment(staff)
    assert page.rooms == {} and page.replies == {}  # nobody connected yet
    async with member(world.alice) as a1, member(world.alice), member(world.bob):
        await a1.post("@a tell me a long story")
        page = await fragment_until(staff, writing)
        room = page.rooms["lab"]
        assert room["sockets"] == "3" and room["online"] == "2" and room["users"] == "alice bob"
        assert (room["streaming"], room["queued"], room["status"]) == ("1", "0", "open")
        assert page.room_sockets["lab"] == {shared.PROCESS_ID: 3}
        ((reply_id, reply),) = page.replies.items()
        assert (reply["room"], reply["assistant"], reply["provider"], reply["model"]) == ("lab", "a", "sim", STALL)
        assert reply["tokens"] == "20" and int(reply["chars"]) > 20
        assert float(reply["tps"]) > 0 and float(reply["elapsed"]) > 0
        assert reply["process"] == shared.PROCESS_ID
        this = page.processes[shared.PROCESS_ID]
        assert (this["sockets"], this["replies"], this["here"]) == ("3", "1", "1")
        stored = await database_sync_to_async(Message.objects.get)(pk=reply_id)
        assert stored.status == Message.Status.STREAMING
        # the page itself: the fragment inside, polled by the admin's own htmx copy
        whole = (await staff.get(LIVE)).content.decode()
        assert 'hx-trigger="every 2s"' in whole and "django_htmx/htmx-2.min.js" in whole
        assert f'data-reply="{reply_id}"' in whole
    page = await fragment_until(staff, lambda p: "lab" not in p.rooms or p.rooms["lab"]["sockets"] == "0")
    assert page.processes[shared.PROCESS_ID]["sockets"] == "0"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("layer", "stalls")
async def test_a_reply_waiting_for_its_provider_is_shown_queued(world: World, staff: AsyncClient) -> None:
    world.provider.max_concurrency = 1  # one stream at a time on this process: the second waits
    await database_sync_to_async(world.provider.save)()
    async with member(world.alice) as a:
        await a.post("@a @b both of you")
        page = await fragment_until(staff, lambda p: writing(p) and len(p.replies) == 2)
        states = sorted(r["state"] for r in page.replies.values())
        assert states == ["queued", "writing"]
        assert (page.rooms["lab"]["streaming"], page.rooms["lab"]["queued"]) == ("1", "1")
        queued = next(r for r in page.replies.values() if r["state"] == "queued")
        assert queued["tokens"] == "0" and queued["tps"] == "0.0"


async def stop_via_page(client: AsyncClient, reply_id: int) -> Fragment:
    response = await client.post(f"{LIVE}stop/{reply_id}/", headers=HX)
    assert response.status_code == 200
    return Fragment(response.content.decode())


def audit(action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=action).select_related("actor", "room"))


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("layer", "stalls")
async def test_the_stop_button_stops_that_reply_keeps_its_text_and_is_audited(world: World, staff: AsyncClient) -> None:
    async with member(world.alice) as a, member(world.bob) as b:
        await a.post("@a @b both, please")
        page = await fragment_until(staff, lambda p: writing(p, 2))
        first, second = sorted(page.replies)
        after = await stop_via_page(staff, first)
        assert after.notice == "ok"
        for m in (a, b):
            await m.until(lambda f: first in f.replies and bool(f.replies[first].final_attrs))
        assert a.frames.replies[first].final_attrs["data-status"] == "stopped"
        assert not b.frames.replies[second].final_attrs  # the other one goes on
        page = await fragment_until(staff, lambda p: first not in p.replies)
        assert list(page.replies) == [second]
        again = await stop_via_page(staff, first)  # a reply that has ended: said so, nothing done
        assert again.notice == "reply.not_streaming"
    stored = await database_sync_to_async(Message.objects.get)(pk=first)
    assert stored.status == Message.Status.STOPPED and stored.text == a.frames.replies[first].text != ""
    (entry,) = await database_sync_to_async(audit)("stop_reply")
    assert (entry.actor_name, entry.room_name, entry.address) == ("root", "lab", "127.0.0.1")
    assert str(first) in entry.detail


def error_codes(m: Member) -> list[str]:
    return [code for code, _text in m.frames.errors]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("layer", "stalls")
async def test_close_and_lock_buttons_act_on_the_room_and_are_audited(world: World, staff: AsyncClient) -> None:
    room_id = world.room.pk
    async with member(world.alice) as a, member(world.bob) as b:
        await fragment_until(staff, lambda p: p.rooms.get("lab", {}).get("sockets") == "2")
        response = await staff.post(f"{LIVE}room/{room_id}/lock/", headers=HX)
        page = Fragment(response.content.decode())
        assert page.notice == "ok" and page.rooms["lab"]["status"] == "locked"
        await b.until(lambda f: 'data-status="locked"' in "".join(b.raw))
        await b.post("anyone there?")
        await b.until(lambda f: "room.locked" in error_codes(b))
        assert await database_sync_to_async(Message.objects.filter(room_id=room_id).count)() == 0
        response = await staff.post(f"{LIVE}room/{room_id}/close/", headers=HX)
        assert Fragment(response.content.decode()).notice == "ok"
        for m in (a, b):
            assert await closed(m) == 4403 and error_codes(m)[-1] == "room.closed"
    assert (await database_sync_to_async(Room.objects.get)(pk=room_id)).status == Room.Status.LOCKED
    for action in ("lock", "close"):
        (entry,) = await database_sync_to_async(audit)(action)
        assert (entry.actor_name, entry.room_name) == ("root", "lab")
    # a plain form post (no htmx) comes back to the page, with the outcome as a message
    response = await staff.post(f"{LIVE}room/{room_id}/unlock/")
    assert response.status_code == 302 and response["Location"] == LIVE
    response = await staff.post(f"{LIVE}room/{room_id}/explode/", headers=HX)
    assert response.status_code == 404
    response = await staff.post(f"{LIVE}stop/999999/", headers=HX)
    assert response.status_code == 404


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("memory_layer", "stalls")
async def test_non_staff_get_nothing_and_change_nothing(world: World, staff: AsyncClient) -> None:
    async with member(world.alice) as a:
        await a.post("@a hello")
        page = await fragment_until(staff, writing)
        (reply_id,) = page.replies
        room_id = world.room.pk
        bob = AsyncClient()
        await bob.aforce_login(world.bob)  # the room's member, not staff
        # the admin's login for a user who is not staff; the site's for nobody at all
        for client, login in ((bob, "/admin/login/"), (AsyncClient(), "/accounts/login/")):
            for url in (LIVE, FRAGMENT):
                response = await client.get(url)
                assert response.status_code == 302 and response["Location"] == f"{login}?next={url}"
            for url in (f"{LIVE}stop/{reply_id}/", *(f"{LIVE}room/{room_id}/{act}/" for act in ("close", "lock"))):
                response = await client.post(url, headers=HX)
                assert response.status_code == 302 and response["Location"].startswith(login)
        csrf_checked = AsyncClient(enforce_csrf_checks=True)
        await csrf_checked.aforce_login(await database_sync_to_async(User.objects.get)(username="root"))
        assert (await csrf_checked.post(f"{LIVE}stop/{reply_id}/")).status_code == 403  # no CSRF token
        assert (await staff.get(f"{LIVE}stop/{reply_id}/")).status_code == 405  # a GET changes nothing
        page = await fragment(staff)
        assert page.replies[reply_id]["state"] == "writing"
    assert await database_sync_to_async(AuditEntry.objects.count)() == 0
    assert (await database_sync_to_async(Room.objects.get)(pk=room_id)).status == Room.Status.OPEN


# --- the shared state's part: one status per process, which expires ------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("layer", "replies_idle")
async def test_each_process_publishes_its_status_which_expires(world: World) -> None:
    state = shared.backend()
    await state.publish_status("p1", json.dumps({"process": "p1"}))
    await state.publish_status("p2", json.dumps({"process": "p2", "sockets": {}}))
    await state.publish_status("p1", json.dumps({"process": "p1", "again": True}))  # replaces its last one
    found = {s.process: s for s in await state.process_statuses()}
    assert set(found) == {"p1", "p2"}
    assert json.loads(found["p1"].status) == {"process": "p1", "again": True}
    assert all(0 <= s.age_s < STATUS_TTL_S for s in found.values())
    runtime.socket_opened("chan-1", world.room.pk, world.alice.pk)
    kept = runtime._uptime, runtime.stale  # the runtime is the process's own: leave it as found
    try:
        await runtime.beat()  # the heartbeat publishes this process's status
    finally:
        runtime.socket_closed("chan-1")
        runtime._uptime, runtime.stale = kept
    mine = {s.process: json.loads(s.status) for s in await state.process_statuses()}[shared.PROCESS_ID]
    assert mine["sockets"] == {str(world.room.pk): {str(world.alice.pk): 1}} and mine["replies"] == []
    if isinstance(state, RedisState):  # Redis: every status carries its expiry
        ttl_ms = await state.redis.pttl(f"{state.p}ps:p1")
        assert 0 < ttl_ms <= STATUS_TTL_S * 1000
