"""Who may use which assistant (issue 33, item 2; docs/wire.md, "Room settings"; README
"Security"). Staff set each assistant's availability: every room, or only the rooms they
grant it to (per room, or per group: the rooms whose owner is in a granted group). A new
assistant is granted-only. The settings page offers only what the room may attach; a
forged form is refused (400) and audited; an assistant attached earlier but no longer
available never runs, whatever asks (a post, @all, /each, regenerate, continue, merge),
and no model nor tool is called. Over HTTP (the settings page) and real sockets, with the
simulated model and a real HTTP tool server."""

from __future__ import annotations

import re
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import Group, User
from django.test import Client

from collab.chat.errors import ClientError
from collab.chat.models import Assistant, AuditEntry, Membership, Message, Room, Tool
from collab.chat.services import rooms
from tests.conftest import Member, World, all_final, member
from tests.httpd import serving
from tests.test_merge import ask

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("replies_idle")]
live = pytest.mark.usefixtures("layer")  # in memory, and on Redis (both channel layers)
memory = pytest.mark.usefixtures("memory_layer")

ADDRESS = "198.51.100.77"
CHOICE_RE = re.compile(r'<input type="checkbox" name="assistants" value="(\d+)"')


@pytest.fixture
def probe_server(settings: Any) -> Iterator[tuple[str, list[str]]]:
    """The staff's internal HTTP endpoint, reachable (its network allowed) and recording."""
    settings.COLLAB_TOOL_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            hits.append(self.headers.get("Authorization", ""))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a: Any) -> None:
            pass

    with serving(Handler) as url:
        yield url, hits


def internal_agent(world: World, url: str = "http://127.0.0.1:9/") -> Assistant:
    """The staff's agent, as staff register it: an HTTP tool with the server's key."""
    probe = Tool.objects.create(name="probe", description="probe", url=url, enabled=True)
    made = Assistant.objects.create(
        handle="internal", display_name="Internal", provider=world.provider, model="sim", is_agent=True
    )
    made.tools.add(probe)
    return made


def page(user: User, method: str = "get", fields: dict[str, Any] | None = None, slug: str = "lab") -> Any:
    client = Client(REMOTE_ADDR=ADDRESS)
    client.force_login(user)
    path = f"/r/{slug}/settings/"
    return client.get(path) if method == "get" else client.post(path, fields or {})


def offered(response: Any) -> set[int]:
    return {int(pk) for pk in CHOICE_RE.findall(response.content.decode())}


def settings_form(world: World, *assistants: Assistant) -> dict[str, Any]:
    return {"op": "settings", "topic": "testing", "reply_to_all": "", "assistants": [str(a.pk) for a in assistants]}


# --- the settings page ---------------------------------------------------------------------------


@memory
def test_a_new_assistant_is_granted_only_and_the_page_offers_what_the_room_may_attach(world: World) -> None:
    internal = internal_agent(world)
    assert internal.available_to == Assistant.Availability.GRANTED  # new: granted-only
    default = rooms.create_room(world.alice, "Mine").assistants.get()
    assert default.available_to == Assistant.Availability.EVERYONE  # the default @assistant: every room
    mine = {world.assistants["a"].pk, world.assistants["b"].pk}
    assert offered(page(world.alice)) == mine | {default.pk}
    internal.granted_rooms.add(Room.objects.get(slug="mine"))  # granted to another room of hers
    assert internal.pk not in offered(page(world.alice))
    internal.granted_rooms.add(world.room)  # granted to this room
    assert internal.pk in offered(page(world.alice))


@memory
def test_a_group_grant_reaches_the_rooms_its_members_own(world: World) -> None:
    internal = internal_agent(world)
    team = Group.objects.create(name="platform")
    internal.granted_groups.add(team)
    assert internal.pk not in offered(page(world.alice))
    world.bob.groups.add(team)  # a member of the room, not its owner: not enough
    assert internal.pk not in offered(page(world.alice))
    world.alice.groups.add(team)
    assert internal.pk in offered(page(world.alice))
    response = page(world.alice, "post", settings_form(world, world.assistants["a"], internal))
    assert response.status_code == 302
    assert set(world.room.assistants.values_list("handle", flat=True)) == {"a", "internal"}


@memory
def test_a_forged_form_is_refused_and_audited_with_nothing_changed(world: World) -> None:
    internal = internal_agent(world)
    before = sorted(world.room.assistants.values_list("handle", flat=True))
    response = page(world.alice, "post", settings_form(world, world.assistants["a"], internal))
    assert response.status_code == 400
    assert "not available to this room" in response.content.decode()
    assert sorted(Room.objects.get(pk=world.room.pk).assistants.values_list("handle", flat=True)) == before
    rows = list(AuditEntry.objects.values_list("actor_name", "action", "room_name", "detail", "address"))
    assert rows == [("alice", "assistant.refused", "lab", f"@internal (id {internal.pk})", ADDRESS)]
    # an id that is no assistant at all: refused and audited too
    assert page(world.alice, "post", {**settings_form(world), "assistants": ["999999"]}).status_code == 400
    assert AuditEntry.objects.filter(action="assistant.refused", detail="id 999999").count() == 1
    # nor a number at all: the form's error, and the row shows it escaped
    assert page(world.alice, "post", {**settings_form(world), "assistants": ["²", "x\x00y"]}).status_code == 400
    assert set(AuditEntry.objects.filter(detail__in=["id ²", "id 'x\\x00y'"]).values_list("detail", flat=True)) == {
        "id ²",
        "id 'x\\x00y'",
    }
    assert (
        list(Room.objects.get(pk=world.room.pk).assistants.order_by("handle").values_list("handle", flat=True))
        == before
    )


@memory
def test_the_room_service_refuses_what_the_room_may_not_use_whatever_the_form_let_through(world: World) -> None:
    """The second layer: rooms.update_room checks again, inside its transaction, so a form
    that let an id through (or any other caller) changes nothing."""
    internal = internal_agent(world)
    before = set(world.room.assistants.values_list("pk", flat=True))
    with pytest.raises(ClientError) as refused_:
        rooms.update_room(world.room, topic="t", reply_to_all=False, assistant_ids=[*before, internal.pk])
    assert refused_.value.code == "assistant.unavailable"
    assert set(Room.objects.get(pk=world.room.pk).assistants.values_list("pk", flat=True)) == before


def test_an_attachment_that_is_no_longer_available_is_kept_but_inert(world: World) -> None:
    internal = internal_agent(world)
    internal.granted_rooms.add(world.room)
    world.room.assistants.add(internal)
    internal.granted_rooms.remove(world.room)  # staff take it back
    shown = page(world.alice)
    assert internal.pk not in offered(shown) and "@internal" in shown.content.decode()  # listed as unavailable
    # saving the form keeps it attached (nothing the owner did not ask is lost): staff may grant it again
    assert page(world.alice, "post", settings_form(world, world.assistants["a"])).status_code == 302
    assert set(world.room.assistants.values_list("handle", flat=True)) == {"a", "internal"}


# --- nothing runs an assistant the room may not use ----------------------------------------------


async def refused(m: Member, code: str, **frame: Any) -> None:
    before = len(m.frames.errors)
    await m.send(**frame)
    await m.until(lambda f: len(f.errors) > before, timeout=10)
    assert m.frames.errors[-1][0] == code, m.frames.errors[-1]


@live
async def test_posting_to_an_attached_assistant_no_longer_available_runs_nothing(
    world: World, sim: tuple[str, Any], probe_server: tuple[str, list[str]]
) -> None:
    """The report: a self-made room attached the staff's @internal and posted a tool call."""
    url, hits = probe_server

    def attach() -> None:
        world.room.assistants.add(internal_agent(world, url))  # as the old settings page let any owner do

    await database_sync_to_async(attach)()
    requests = sim[1].stats.requests
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.post('@internal {{tool probe {"path": "/admin"}}}')
        await alice.until(lambda f: bool(f.errors) or all_final(f, 1), timeout=30)
        assert hits == []  # the staff's endpoint was never called with the server's key
        code, text = alice.frames.errors[-1]
        assert code == "assistant.unavailable" and "@internal" in text
        await bob.until(lambda f: any(r.role == "user" for r in f.replies.values()))  # the post itself is stored
        await alice.post("@all hello")  # @all: the room's available assistants only
        await alice.until(lambda f: all_final(f, 2))
    assert hits == []

    def stored() -> list[str | None]:
        return [m.assistant.handle if m.assistant else None for m in Message.objects.filter(role="assistant")]

    assert sorted(await database_sync_to_async(stored)()) == ["a", "b"]  # nothing for @internal
    assert sim[1].stats.requests == requests + 2


@memory
async def test_regenerate_continue_merge_and_each_refuse_an_assistant_taken_back(
    world: World, sim: tuple[str, Any]
) -> None:
    def setup() -> tuple[int, int]:
        a = world.assistants["a"]
        asked = ask(world)  # alice's question, approved answers of @a and @b
        Message.objects.filter(pk=asked.apples).update(finish_reason="length")  # cut off: continuable
        a.available_to = Assistant.Availability.GRANTED  # staff take @a back from every room
        a.save()
        Membership.objects.filter(room=world.room, user=world.bob).update(lens="in French")
        return asked.apples, asked.question

    apples, question = await database_sync_to_async(setup)()
    requests = sim[1].stats.requests
    count = await Message.objects.acount()
    async with member(world.alice) as alice:
        await refused(alice, "assistant.unavailable", action="regenerate", message_id=apples)
        await refused(alice, "assistant.unavailable", action="continue", message_id=apples)
        await refused(alice, "assistant.unavailable", action="merge", message_id=question, assistant="a")
        await refused(alice, "assistant.unavailable", text="/each @a what now?")  # refused whole, as /each is
        await refused(alice, "assistant.unavailable", text="@a and now?")  # stored, no reply
    assert sim[1].stats.requests == requests  # no model was asked
    texts = [t async for t in Message.objects.filter(pk__gt=apples, role="user").values_list("text", flat=True)]
    assert texts == ["@a and now?"] and await Message.objects.acount() == count + 1
    assert not await Message.objects.filter(role="assistant", status="streaming").aexists()


@memory
async def test_taking_a_group_grant_back_stops_the_next_post_on_a_process_that_knew_the_room(
    world: World, sim: tuple[str, Any]
) -> None:
    def grant() -> Group:
        team = Group.objects.create(name="platform")
        helper = Assistant.objects.create(handle="helper", display_name="Helper", provider=world.provider, model="sim")
        helper.granted_groups.add(team)
        world.alice.groups.add(team)
        world.room.assistants.add(helper)
        return team

    team = await database_sync_to_async(grant)()
    async with member(world.alice) as alice:
        await alice.post("@helper one")  # runs; this process now knows the room (replies/early.py)
        await alice.until(lambda f: all_final(f, 1))
        await alice.post("@helper two")
        await alice.until(lambda f: all_final(f, 2))
        await database_sync_to_async(world.alice.groups.remove)(team)
        requests = sim[1].stats.requests
        await alice.post("@helper three")
        await alice.until(lambda f: bool(f.errors))
        assert alice.frames.errors[-1][0] == "assistant.unavailable"
    assert sim[1].stats.requests == requests  # not even an early request went out


# --- staff set it in the admin -----------------------------------------------------------------


@memory
def test_staff_grant_an_assistant_in_the_admin_audited_and_a_default_stays_for_everyone(world: World) -> None:
    internal = internal_agent(world)
    root = User.objects.create_user("root", is_staff=True, is_superuser=True)
    staff = Client(REMOTE_ADDR=ADDRESS)
    staff.force_login(root)
    form = staff.get(f"/admin/chat/assistant/{internal.pk}/change/").context["adminform"].form
    fields = {k: v for k, v in form.initial.items() if v is not None and k not in ("tools", "granted_rooms")}
    fields.update(
        provider=str(world.provider.pk), tools=[str(t.pk) for t in internal.tools.all()],
        granted_rooms=[str(world.room.pk)], is_agent="on",
    )  # fmt: skip
    response = staff.post(f"/admin/chat/assistant/{internal.pk}/change/", fields)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert list(internal.granted_rooms.values_list("slug", flat=True)) == ["lab"]
    assert internal.pk in offered(page(world.alice))
    assert AuditEntry.objects.get(action="assistant.change").detail == "@internal: granted_rooms"
    # a default assistant (every new room gets it) cannot be granted-only
    refused = staff.post(
        f"/admin/chat/assistant/{internal.pk}/change/", {**fields, "is_default": "on", "available_to": "granted"}
    )
    assert refused.status_code == 200
    assert "make it available to every room" in " ".join(refused.context["adminform"].form.errors["available_to"])
