"""What a review of the admin found, each pinned: the live page asks for Django's
permissions, a banned staff member is banned too, Redis away turns an admin action into
a clear error (or a stored change), never a 500 after the fact; an action that changed
nothing leaves no audit row."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from django.contrib.auth.models import Permission, User
from django.test import Client

from collab.chat.errors import ClientError
from collab.chat.models import AuditEntry, Ban, Membership, Provider, Room
from collab.chat.services import moderation
from tests.conftest import World, connected

pytestmark = pytest.mark.django_db(transaction=True)
memory = pytest.mark.usefixtures("memory_layer")


def staff(username: str, *codenames: str) -> Client:
    user = User.objects.create_user(username, is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def actions() -> list[tuple[str, str]]:
    return list(AuditEntry.objects.order_by("id").values_list("actor_name", "action"))


# --- the live page asks for the permissions the room list asks for ------------------------------


@memory
def test_the_live_page_needs_view_and_its_buttons_change_permission(world: World) -> None:
    nobody, viewer = staff("intern"), staff("viewer", "view_room")
    room = world.room
    for client in (nobody, viewer):
        for action in ("lock", "close"):
            assert client.post(f"/admin/chat/room/live/room/{room.pk}/{action}/").status_code == 403
    assert nobody.get("/admin/chat/room/live/").status_code == 403
    assert nobody.get("/admin/chat/room/live/fragment/").status_code == 403
    assert viewer.get("/admin/chat/room/live/").status_code == 200
    room.refresh_from_db()
    assert room.status == Room.Status.OPEN and actions() == []
    changer = staff("changer", "view_room", "change_room")
    assert changer.post(f"/admin/chat/room/live/room/{room.pk}/lock/").status_code == 302
    room.refresh_from_db()
    assert room.status == Room.Status.LOCKED and actions() == [("changer", "lock")]


@memory
def test_staff_powers_over_a_room_need_the_change_permission(world: World) -> None:
    """A staff member who is a plain member of a room has no more say in it over the
    socket or the settings page than other members, without the permission."""
    clerk = User.objects.create_user("clerk", is_staff=True)
    Membership.objects.create(room=world.room, user=clerk)
    with pytest.raises(ClientError) as refused:
        moderation.lock(moderation.Actor(clerk), world.room)
    assert refused.value.code == "room.not_allowed"
    clerk.user_permissions.add(Permission.objects.get(codename="change_room"))
    clerk = User.objects.get(pk=clerk.pk)  # permissions are cached per instance
    assert moderation.lock(moderation.Actor(clerk), world.room)


# --- a banned staff member is banned ------------------------------------------------------------


@memory
async def test_a_banned_staff_member_gets_the_ban_page_and_no_socket(world: World) -> None:
    def setup() -> tuple[User, Client]:
        dave = User.objects.create_user("dave", is_staff=True)
        Ban.objects.create(room=world.room, user=dave, by=world.alice)
        client = Client()
        client.force_login(dave)
        return dave, client

    dave, client = await database_sync_to_async(setup)()
    page = await database_sync_to_async(client.get)("/r/lab/")
    assert page.status_code == 403 and b"banned" in page.content
    async with connected(dave, "lab") as (ok, _code, m):
        assert ok
        out = await m.comm.receive_output(timeout=5)
        assert out["type"] == "websocket.close" and out["code"] == 4403


# --- Redis away: a clear answer, never a 500 after the change ------------------------------------


@pytest.fixture
def redis_away(settings: Any) -> Any:
    dead = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer", "CONFIG": {"hosts": [dead]}}
    }
    settings.COLLAB_SHARED_REDIS_URL = settings.REDIS_URL = dead
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


def superuser() -> Client:
    root = User.objects.create_superuser("root", password="pw-root-123")
    client = Client(raise_request_exception=False)
    client.force_login(root)
    return client


@pytest.mark.usefixtures("redis_away")
def test_with_redis_away_a_stored_change_is_kept_and_said_never_a_500(world: World) -> None:
    client = superuser()
    room = world.room
    locked = client.post("/admin/chat/room/", {"action": "lock", "_selected_action": [room.pk]}, follow=True)
    assert locked.status_code == 200
    room.refresh_from_db()
    assert room.status == Room.Status.LOCKED  # stored; the pages learn it from their next snapshot
    membership = Membership.objects.get(room=room, user=world.bob)
    kicked = client.post("/admin/chat/membership/", {"action": "kick", "_selected_action": [membership.pk]})
    assert kicked.status_code == 302
    assert not Membership.objects.filter(room=room, user=world.bob).exists()
    assert actions() == [("root", "lock"), ("root", "kick")]


@pytest.mark.usefixtures("redis_away")
@pytest.mark.parametrize("how", ["live_close", "changelist_close", "changelist_stop_all"])
def test_with_redis_away_an_action_that_must_reach_sockets_is_refused_and_not_recorded(world: World, how: str) -> None:
    client = superuser()
    room = world.room
    if how == "live_close":
        response = client.post(f"/admin/chat/room/live/room/{room.pk}/close/", follow=True)
    else:
        action = how.removeprefix("changelist_")
        response = client.post("/admin/chat/room/", {"action": action, "_selected_action": [room.pk]}, follow=True)
    assert response.status_code == 200
    assert "nothing was done" in response.content.decode()
    assert actions() == []


# --- audit rows only for what happened ------------------------------------------------------------


@memory
def test_a_second_kick_of_the_same_member_is_refused_and_leaves_no_second_row(world: World) -> None:
    owner = moderation.Actor(world.alice, "10.0.0.1")
    moderation.kick(owner, world.room, "bob")
    with pytest.raises(ClientError) as again:
        moderation.kick(owner, world.room, "bob")
    assert again.value.code == "member.not_found"
    assert actions() == [("alice", "kick")]


@memory
def test_banning_an_unknown_name_says_what_it_says_for_a_non_member(world: World) -> None:
    """No way to tell which usernames exist from the ban form."""
    owner = moderation.Actor(world.alice)
    with pytest.raises(ClientError) as unknown:
        moderation.ban(owner, world.room, "nosuchuser")
    assert unknown.value.message == "nosuchuser is not a member of this room."


@memory
def test_saving_a_provider_unchanged_leaves_no_row_and_an_assistant_change_one(world: World) -> None:
    client = superuser()
    provider = Provider.objects.get(pk=world.provider.pk)
    page = client.get(f"/admin/chat/provider/{provider.pk}/change/")
    form = {k: v for k, v in page.context["adminform"].form.initial.items() if v is not None}
    form.update(base_url=provider.base_url, price_input_per_m="0", price_output_per_m="0")
    assert client.post(f"/admin/chat/provider/{provider.pk}/change/", form).status_code == 302
    assert actions() == []
    assistant = world.assistants["a"]
    data = {
        "handle": assistant.handle,
        "display_name": "Renamed",
        "provider": str(provider.pk),
        "model": assistant.model,
        "system_prompt": assistant.system_prompt,
        "temperature": str(assistant.temperature),
        "max_tokens": str(assistant.max_tokens),
        "agent_steps": str(assistant.agent_steps),
        "agent_tokens": str(assistant.agent_tokens),
        "available_to": assistant.available_to,
        "vision": "on",  # a checked box, as the page posts it (unchanged)
    }
    assert client.post(f"/admin/chat/assistant/{assistant.pk}/change/", data).status_code == 302
    entry = AuditEntry.objects.get()
    assert (entry.actor_name, entry.action, entry.detail) == ("root", "assistant.change", "@a: display_name")
