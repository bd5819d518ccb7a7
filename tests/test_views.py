"""Pages: accounts, rooms, invites, leaving, settings, older messages, health."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.template import Context, Template
from django.test import Client

from collab.chat.models import Assistant, AuditEntry, Ban, Membership, Message, Provider, Room
from collab.chat.services import providers, rooms

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
    extra = Assistant.objects.create(
        handle="extra", display_name="Extra", provider=room.assistants.get().provider, available_to="everyone"
    )
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


# --- each assistant's model, and the embedded model labelled ---------------------------------

TINY_LABEL = "SmolLM2-135M · a tiny local model: quick, often wrong"


@pytest.fixture
def models_room(alice: User) -> Room:
    """A room with an assistant on a hosted provider and one on the embedded local model."""
    room = rooms.create_room(alice, "Models")
    hosted = Provider.objects.create(name="groq", base_url="https://api.example/v1", default_model="llama-3.1-8b")
    local = Provider.objects.create(name="local", base_url="http://127.0.0.1:8088/v1", default_model="x")
    room.assistants.set(
        [
            Assistant.objects.create(handle="fast", display_name="Fast", provider=hosted, available_to="everyone"),
            Assistant.objects.create(
                handle="tiny",
                display_name="Tiny",
                provider=local,
                model="smollm2-135m-instruct",
                available_to="everyone",
            ),
        ]
    )
    return room


def test_the_room_page_lists_each_assistants_model_and_provider(logged_in: Client, models_room: Room) -> None:
    page = logged_in.get("/r/models/").content.decode()
    side = page.split('<ul class="assistants">')[1].split("</ul>")[0]
    assert '<code>@fast</code> Fast <small class="muted model">llama-3.1-8b (groq)</small>' in side
    link = f'<a href="/docs/providers/#pointing-at-a-model-provider">{TINY_LABEL}</a>'
    assert f'<code>@tiny</code> Tiny <small class="muted model">{link} (local)</small>' in side


def test_the_settings_page_lists_each_assistants_model_and_provider(logged_in: Client, models_room: Room) -> None:
    form = logged_in.get("/r/models/settings/").content.decode().split('id="settings-form"')[1].split("</form>")[0]
    assert "@fast Fast: llama-3.1-8b (groq)</label>" in form
    assert f"@tiny Tiny: {TINY_LABEL} (local)</label>" in form


def test_the_model_label_for_any_page(models_room: Room) -> None:
    """What a reply's info can show: `{{ message.model|model_label }}`, or the assistant's."""
    template = Template("{% load chat_extras %}{{ a|model_label }} / {{ b|model_label }} {{ b|embedded_model }}")
    assert (
        template.render(Context({"a": "llama-3.1-8b", "b": "smollm2-135m-instruct"}))
        == f"llama-3.1-8b / {TINY_LABEL} True"
    )
    tiny, fast = models_room.assistants.get(handle="tiny"), models_room.assistants.get(handle="fast")
    assert (tiny.model_label, tiny.is_embedded_model) == (TINY_LABEL, True)
    assert (fast.model_label, fast.is_embedded_model) == ("llama-3.1-8b", False)


def test_the_provider_settings_are_served_without_a_login(client: Client) -> None:
    """Where the embedded model's label links: README's section, from this server (no network)."""
    response = client.get("/docs/providers/")
    assert response.status_code == 200
    page = response.content.decode()
    assert '<h1 id="pointing-at-a-model-provider">Pointing at a model provider</h1>' in page
    assert "COLLAB_LLM_BASE_URL" in page and "OPENAI_API_KEY" in page and "<pre>" in page and TINY_LABEL in page
    assert "Providers from the environment</h" not in page  # the section only, not what follows


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


def test_favicon_answers_and_every_page_links_it(client: Client) -> None:
    """Browsers ask /favicon.ico whatever a page says: it leads to the SVG the pages link."""
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == "/static/collab/favicon.svg"
    icon = client.get(response["Location"])
    assert icon.status_code == 200 and icon["Content-Type"] == "image/svg+xml"
    assert b"<svg" in b"".join(icon.streaming_content)  # type: ignore[attr-defined]
    link = b'<link rel="icon" href="/static/collab/favicon.svg" type="image/svg+xml">'
    assert link in client.get("/accounts/login/").content
    assert link in client.get("/admin/login/").content


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


# --- the settings page per role, the ban page, the archived invite -----------------------------


@pytest.fixture
def lab(alice: User) -> dict[str, Any]:
    """alice owns Lab; mo moderates it; bob and eve are members; carol is banned (not a member)."""
    room = rooms.create_room(alice, "Lab")
    people: dict[str, Any] = {"room": room, "alice": alice}
    for name, role in (("mo", "moderator"), ("bob", "member"), ("eve", "member")):
        people[name] = User.objects.create_user(name, password=f"pw-{name}-123")
        Membership.objects.create(room=room, user=people[name], role=role)
    people["carol"] = User.objects.create_user("carol", password="pw-carol-123")
    Ban.objects.create(room=room, user=people["carol"], by=alice)
    return people


def as_user(user: User) -> Client:
    client = Client(REMOTE_ADDR="192.0.2.44")
    client.force_login(user)
    return client


def room_state(room: Room) -> tuple[Any, ...]:
    room.refresh_from_db()
    roles = sorted(Membership.objects.filter(room=room).values_list("user__username", "role"))
    bans = sorted(Ban.objects.filter(room=room).values_list("user__username", flat=True))
    settings = (room.topic, room.reply_to_all, sorted(room.assistants.values_list("handle", flat=True)))
    return roles, bans, room.status, room.invite_token, settings, AuditEntry.objects.count()


def test_the_settings_page_per_role(lab: dict[str, Any]) -> None:
    owner = as_user(lab["alice"]).get("/r/lab/settings/").content.decode()
    for part in ('id="settings-form"', 'id="invite"', 'value="reset_invite"', "Make moderator", "Make member"):
        assert part in owner
    for part in ('value="kick"', 'value="ban"', 'value="unban"', 'value="lock"', 'id="bans"'):
        assert part in owner
    moderator = as_user(lab["mo"]).get("/r/lab/settings/")
    assert moderator.status_code == 200
    page = moderator.content.decode()
    for part in ('value="kick"', 'value="ban"', 'value="unban"', 'value="lock"', 'data-user="carol"'):
        assert part in page
    for part in ('id="settings-form"', 'id="invite"', "reset_invite", "Make moderator", "Make member"):
        assert part not in page
    assert lab["room"].invite_token not in page
    # a moderator is offered kick and ban for members only: not the owner, not itself
    bob_row = page.split('data-user="bob"')[1].split("</li>")[0]
    mo_row = page.split('data-user="mo"')[1].split("</li>")[0]
    alice_row = page.split('data-user="alice"')[1].split("</li>")[0]
    assert 'value="kick"' in bob_row and 'value="kick"' not in mo_row + alice_row
    member = as_user(lab["bob"]).get("/r/lab/settings/")
    assert member.status_code == 403 and b"owner and its moderators" in member.content
    assert b'value="kick"' not in member.content
    assert as_user(lab["carol"]).get("/r/lab/settings/").status_code == 404  # not a member


MEMBER_POSTS = {
    "kick": {"op": "kick", "username": "eve"},
    "remove_member": {"op": "remove_member", "username": "eve"},
    "ban": {"op": "ban", "username": "eve", "reason": "no"},
    "unban": {"op": "unban", "username": "carol"},
    "lock": {"op": "lock"},
    "unlock": {"op": "unlock"},
    "role": {"op": "role", "username": "eve", "role": "moderator"},
    "reset_invite": {"op": "reset_invite"},
    "settings": {"topic": "taken over", "reply_to_all": "on"},
}


@pytest.mark.parametrize("action", MEMBER_POSTS)
def test_a_plain_member_posting_a_settings_form_gets_403_and_nothing_changes(lab: dict[str, Any], action: str) -> None:
    room = lab["room"]
    if action == "unlock":
        Room.objects.filter(pk=room.pk).update(status=Room.Status.LOCKED)
    before = room_state(room)
    response = as_user(lab["bob"]).post("/r/lab/settings/", MEMBER_POSTS[action])
    assert response.status_code == 403
    assert room_state(room) == before


@pytest.mark.parametrize("action", ["role", "reset_invite", "settings"])
def test_a_moderator_posting_an_owner_form_gets_403_and_nothing_changes(lab: dict[str, Any], action: str) -> None:
    before = room_state(lab["room"])
    response = as_user(lab["mo"]).post("/r/lab/settings/", MEMBER_POSTS[action])
    assert response.status_code == 403
    assert b'class="error"' in response.content and b"owner" in response.content  # the refusal, flashed
    assert room_state(lab["room"]) == before


def test_a_moderator_cannot_kick_the_owner_or_another_moderator(lab: dict[str, Any]) -> None:
    other = User.objects.create_user("mo2", password="pw-mo2-123")
    Membership.objects.create(room=lab["room"], user=other, role="moderator")
    before = room_state(lab["room"])
    assert as_user(lab["mo"]).post("/r/lab/settings/", {"op": "kick", "username": "mo2"}).status_code == 403
    refused = as_user(lab["mo"]).post("/r/lab/settings/", {"op": "ban", "username": "alice"}, follow=True)
    assert b"owner cannot be removed" in refused.content
    assert room_state(lab["room"]) == before


def test_moderation_from_the_page_is_audited_with_the_address(lab: dict[str, Any]) -> None:
    owner = as_user(lab["alice"])
    assert owner.post("/r/lab/settings/", {"op": "role", "username": "bob", "role": "moderator"}).status_code == 302
    assert Membership.objects.get(room=lab["room"], user=lab["bob"]).role == "moderator"
    mo = as_user(lab["mo"])
    assert mo.post("/r/lab/settings/", {"op": "ban", "username": "eve", "reason": "rude"}).status_code == 302
    assert mo.post("/r/lab/settings/", {"op": "unban", "username": "carol"}).status_code == 302
    assert mo.post("/r/lab/settings/", {"op": "lock"}).status_code == 302
    rows = list(AuditEntry.objects.order_by("id").values_list("actor_name", "action", "target_name", "address"))
    assert rows == [
        ("alice", "role", "bob", "192.0.2.44"),
        ("mo", "ban", "eve", "192.0.2.44"),
        ("mo", "unban", "carol", "192.0.2.44"),
        ("mo", "lock", "", "192.0.2.44"),
    ]
    assert Ban.objects.get(room=lab["room"]).reason == "rude"
    lab["room"].refresh_from_db()
    assert lab["room"].status == "locked"


def test_a_refused_action_is_a_flash_error_on_the_page(lab: dict[str, Any]) -> None:
    owner = as_user(lab["alice"])
    before = room_state(lab["room"])
    for fields, says in [
        ({"op": "kick", "username": "nobody"}, b"nobody is not a member"),
        ({"op": "kick", "username": ""}, b"Name the member"),
        ({"op": "unban", "username": "bob"}, b"bob is not banned"),
        ({"op": "ban", "username": "carol"}, b"already banned"),
        ({"op": "role", "username": "bob", "role": "owner"}, b"moderator"),
    ]:
        response = owner.post("/r/lab/settings/", fields, follow=True)
        assert response.redirect_chain == [("/r/lab/settings/", 302)]
        assert b'class="error"' in response.content and says in response.content, fields
    assert room_state(lab["room"]) == before
    assert owner.post("/r/lab/settings/", {"op": "explode"}).status_code == 400


def test_the_room_page_shows_roles_and_the_settings_link_to_moderators(lab: dict[str, Any]) -> None:
    for who, sees_link in (("alice", True), ("mo", True), ("bob", False)):
        page = as_user(lab[who]).get("/r/lab/").content.decode()
        page = re.sub(r'<span class="avatar[^>]*></span>', "", page)  # each member's avatar (chat/people.py)
        assert ('href="/r/lab/settings/"' in page) is sees_link, who
        assert ("Leave room" in page) is (who != "alice"), who
        assert 'data-user="mo" data-online="0">mo <small class="role">(moderator)</small>' in page
        assert 'data-user="alice" data-online="0">alice <small class="role">(owner)</small>' in page
        assert 'data-user="bob" data-online="0">bob</li>' in page


def test_a_banned_user_gets_the_ban_page_not_a_404_nor_a_form(lab: dict[str, Any]) -> None:
    carol = as_user(lab["carol"])
    invite = f"/join/{lab['room'].invite_token}/"
    for response in (carol.get(invite), carol.post(invite), carol.get("/r/lab/")):
        assert response.status_code == 403
        body = response.content.decode()
        assert "You were banned from Lab" in body and "ask its owner, <strong>alice</strong>" in body
        assert "<form" not in body.split("<main>")[1]
    assert not Membership.objects.filter(user=lab["carol"]).exists()
    assert carol.get("/r/lab/older/?before=5").status_code == 404  # the rest of the room stays a 404


def test_an_archived_rooms_invite_says_so(lab: dict[str, Any]) -> None:
    Room.objects.filter(pk=lab["room"].pk).update(status=Room.Status.ARCHIVED)
    stranger = as_user(User.objects.create_user("frank", password="pw-frank-123"))
    invite = f"/join/{lab['room'].invite_token}/"
    for response in (stranger.get(invite), stranger.post(invite)):
        assert response.status_code == 403
        body = response.content.decode()
        assert "Lab is archived" in body and "<form" not in body.split("<main>")[1]
    assert not Membership.objects.filter(user__username="frank").exists()
