"""Pages: accounts, rooms, invites, leaving, settings, older messages, health."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from collab.chat.actions import providers, rooms
from collab.chat.models import Assistant, Membership, Message, Room

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice", password="pw-alice-123")


@pytest.fixture
def logged_in(alice: User) -> Client:
    client = Client()
    client.force_login(alice)
    return client


def test_pages_need_login(client: Client) -> None:
    for url in ["/", "/r/x/", "/r/x/settings/", "/join/abc/"]:
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_signup_logs_in(client: Client) -> None:
    response = client.post(
        "/accounts/signup/",
        {"username": "newbie", "password1": "a-long-pass-123", "password2": "a-long-pass-123"},
    )
    assert response.status_code == 302
    assert client.get("/").status_code == 200


@pytest.mark.parametrize(
    ("next_url", "lands_on"),
    [("https://evil.example/phish", "/"), ("//evil.example/x", "/"), ("/r/somewhere/", "/r/somewhere/")],
)
def test_signup_follows_next_only_on_this_site(client: Client, next_url: str, lands_on: str) -> None:
    response = client.post(
        f"/accounts/signup/?next={next_url}",
        {"username": "newbie", "password1": "a-long-pass-123", "password2": "a-long-pass-123"},
    )
    assert response.status_code == 302 and response["Location"] == lands_on


@pytest.mark.parametrize("method", ["head", "put", "delete", "patch"])
def test_the_rooms_page_answers_other_methods_with_405(client: Client, alice: User, method: str) -> None:
    client.force_login(alice)
    assert getattr(client, method)("/").status_code == 405


def test_every_page_answers_a_wrong_method_with_405(client: Client, alice: User) -> None:
    room = rooms.create_room(alice, "Methods")
    client.force_login(alice)
    pages = [
        "/",
        "/accounts/signup/",
        f"/r/{room.slug}/",
        f"/r/{room.slug}/older/?before=1",
        f"/r/{room.slug}/leave/",
        f"/r/{room.slug}/settings/",
        f"/join/{room.invite_token}/",
        "/healthz",
        "/metrics",
        "/accounts/login/",
    ]
    answers = {url: client.put(url).status_code for url in pages}
    assert answers == dict.fromkeys(pages, 405)


def test_login_page_and_post(client: Client, alice: User) -> None:
    assert client.get("/accounts/login/").status_code == 200
    response = client.post("/accounts/login/", {"username": "alice", "password": "pw-alice-123"})
    assert response.status_code == 302 and "sessionid" in response.cookies


def test_create_room_makes_owner_with_default_assistant(logged_in: Client, alice: User) -> None:
    response = logged_in.post("/", {"name": "Team Room", "topic": "plans"})
    assert response.status_code == 302 and response["Location"] == "/r/team-room/"
    room = Room.objects.get(slug="team-room")
    assert room.owner == alice and room.topic == "plans"
    assert Membership.objects.get(room=room, user=alice).role == "owner"
    assert [a.handle for a in room.assistants.all()] == ["assistant"]
    # a second room of the same name gets its own slug
    logged_in.post("/", {"name": "Team Room"})
    assert Room.objects.filter(slug="team-room-2").exists()
    page = logged_in.get("/r/team-room/")
    assert page.status_code == 200
    assert b"htmx-2.min.js" in page.content and b'ws-connect="/ws/rooms/team-room/"' in page.content


def test_bad_room_name_is_refused(logged_in: Client) -> None:
    response = logged_in.post("/", {"name": "!!!"})
    assert response.status_code == 200 and b"at least one letter" in response.content
    assert not Room.objects.exists()


def test_non_member_gets_404(logged_in: Client) -> None:
    bob = User.objects.create_user("bob", password="x-pass-123")
    rooms.create_room(bob, "Secret")
    assert logged_in.get("/r/secret/").status_code == 404
    assert logged_in.get("/r/secret/older/?before=5").status_code == 404


def test_invite_join_leave(logged_in: Client, alice: User) -> None:
    bob = User.objects.create_user("bob", password="x-pass-123")
    room = rooms.create_room(bob, "Bobs")
    page = logged_in.get(f"/join/{room.invite_token}/")
    assert page.status_code == 200 and b"Join Bobs" in page.content
    assert not Membership.objects.filter(room=room, user=alice).exists()  # GET changes nothing
    assert logged_in.post(f"/join/{room.invite_token}/").status_code == 302
    assert Membership.objects.filter(room=room, user=alice, role="member").exists()
    assert logged_in.get("/join/not-a-token/").status_code == 404
    assert logged_in.post("/r/bobs/leave/").status_code == 302
    assert not Membership.objects.filter(room=room, user=alice).exists()


def test_owner_cannot_leave(logged_in: Client, alice: User) -> None:
    room = rooms.create_room(alice, "Mine")
    logged_in.post("/r/mine/leave/")
    assert Membership.objects.filter(room=room, user=alice).exists()


def test_reset_invite_invalidates_old_link(logged_in: Client, alice: User) -> None:
    room = rooms.create_room(alice, "Mine")
    old = room.invite_token
    logged_in.post("/r/mine/settings/", {"op": "reset_invite"})
    room.refresh_from_db()
    assert room.invite_token != old
    bob = Client()
    bob.force_login(User.objects.create_user("bob", password="x-pass-123"))
    assert bob.get(f"/join/{old}/").status_code == 404


def test_settings_owner_only_and_attach_assistants(logged_in: Client, alice: User) -> None:
    room = rooms.create_room(alice, "Mine")
    extra = Assistant.objects.create(handle="extra", display_name="Extra", provider=room.assistants.get().provider)
    response = logged_in.post("/r/mine/settings/", {"topic": "new", "reply_to_all": "on", "assistants": [extra.pk]})
    assert response.status_code == 302
    room.refresh_from_db()
    assert room.topic == "new" and room.reply_to_all
    assert [a.handle for a in room.assistants.all()] == ["extra"]
    bob = User.objects.create_user("bob", password="x-pass-123")
    Membership.objects.create(room=room, user=bob)
    other = Client()
    other.force_login(bob)
    assert other.get("/r/mine/settings/").status_code == 403


def test_older_messages_page(logged_in: Client, alice: User) -> None:
    room = rooms.create_room(alice, "Busy")
    for seq in range(1, 121):
        Message.objects.create(room=room, seq=seq, role="user", author=alice, author_name="alice", text=f"m{seq}")
    page = logged_in.get("/r/busy/")
    assert b'data-seq="120"' in page.content and b'data-seq="70"' not in page.content
    assert b"?before=71" in page.content
    older = logged_in.get("/r/busy/older/?before=71")
    assert b'data-seq="70"' in older.content and b'data-seq="21"' in older.content
    assert b'data-seq="20"' not in older.content and b"?before=21" in older.content
    assert logged_in.get("/r/busy/older/?before=x").status_code == 400


def test_healthz(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "database": True, "channel_layer": True}


def test_room_save_never_rewinds_seq(alice: User) -> None:
    room = rooms.create_room(alice, "Seq")
    stale = Room.objects.get(pk=room.pk)
    Room.objects.filter(pk=room.pk).update(last_seq=10)
    stale.topic = "changed"
    stale.save()
    room.refresh_from_db()
    assert room.last_seq == 10 and room.topic == "changed"


def test_cost_totals_per_room_and_user(logged_in: Client, alice: User) -> None:
    from decimal import Decimal

    room = rooms.create_room(alice, "Costly")
    bob = User.objects.create_user("bob", password="x-pass-123")
    Membership.objects.create(room=room, user=bob)
    a_q = Message.objects.create(room=room, seq=1, role="user", author=alice, author_name="alice", text="q")
    b_q = Message.objects.create(room=room, seq=2, role="user", author=bob, author_name="bob", text="q")
    for seq, question, cost in ((3, a_q, "0.0125"), (4, a_q, "0.0100"), (5, b_q, "0.5")):
        Message.objects.create(
            room=room, seq=seq, role="assistant", author_name="A", reply_to=question, cost=Decimal(cost)
        )
    assert providers.user_cost(alice.pk) == Decimal("0.0225")
    assert providers.room_cost(room.pk) == Decimal("0.5225")
    assert b"$0.0225" in logged_in.get("/").content
    assert b"$0.5225" in logged_in.get("/r/costly/").content


def test_healthz_is_503_when_the_channel_layer_does_not_answer(client: Client, settings: object) -> None:
    import socket

    from channels.layers import channel_layers

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{s.getsockname()[1]}/0"
    settings.CHANNEL_LAYERS = {  # type: ignore[attr-defined]
        "default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer", "CONFIG": {"hosts": [dead]}}
    }
    channel_layers.backends.clear()
    try:
        response = client.get("/healthz")
    finally:
        channel_layers.backends.clear()
    assert response.status_code == 503
    assert response.json() == {"ok": False, "database": True, "channel_layer": False}


def test_metrics_need_staff_or_token(client: Client, logged_in: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    assert client.get("/metrics").status_code == 403
    assert logged_in.get("/metrics").status_code == 403  # a member who is not staff
    monkeypatch.setenv("COLLAB_METRICS_TOKEN", "scrape-me")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me")
    assert response.status_code == 200
    body = response.content.decode()
    for name in ("collab_replies_total", "collab_frames_total", "collab_sockets_open", "collab_reply_ttft_seconds"):
        assert name in body


def test_login_is_throttled_per_address_without_locking_the_user_out(
    client: Client, alice: User, settings: Any
) -> None:
    settings.AXES_FAILURE_LIMIT = 3
    wrong = {"username": "alice", "password": "not-her-password"}
    answers = [client.post("/accounts/login/", wrong, REMOTE_ADDR="192.0.2.7").status_code for _ in range(4)]
    assert answers[:2] == [200, 200]  # the form again, with its error
    assert answers[3] == 429
    locked = client.post("/accounts/login/", {"username": "alice", "password": "pw-alice-123"}, REMOTE_ADDR="192.0.2.7")
    assert locked.status_code == 429 and b'data-code="login.throttled"' in locked.content
    # the real user, elsewhere, is not locked out
    elsewhere = Client()
    ok = elsewhere.post(
        "/accounts/login/", {"username": "alice", "password": "pw-alice-123"}, REMOTE_ADDR="198.51.100.4"
    )
    assert ok.status_code == 302 and "sessionid" in ok.cookies
