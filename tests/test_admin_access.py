"""Only staff: every admin URL refuses a logged-in user who is not staff (here the owner
of a room, with something to see) and an anonymous visitor.

The URLs are not listed by hand: they are enumerated from the admin site's URL patterns
(recursively, so that the live page, the usage page and any URL added later are in),
each becomes its own test case, GET and POST, and every action of every changelist is
posted too. Path parameters are filled with real objects' ids, so that the view would
answer if the permission check let the request through; and the staff user does get an
answer from each URL (200, or the refusal that view gives everyone by design, computed
from its ModelAdmin's permissions), which shows the refusal comes from the permission,
not from a broken URL. A guard test checks the enumeration found the URLs it must.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from allauth.socialaccount.models import SocialAccount
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.apps import apps
from django.conf import settings
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.contrib.contenttypes.models import ContentType
from django.core.files.base import ContentFile
from django.db import models
from django.shortcuts import resolve_url
from django.test import Client, RequestFactory
from django.urls import URLPattern, URLResolver, resolve

from collab.chat.models import (
    Assistant,
    Attachment,
    AuditEntry,
    Ban,
    McpCall,
    McpServer,
    McpTool,
    Membership,
    Message,
    Provider,
    Room,
    RoomDefaults,
    Tool,
    Vote,
)

pytestmark = pytest.mark.django_db

PREFIX = "/admin/"
# Where a refusal leads: the admin's login (admin_view), or, for an anonymous visitor, the
# site's (LoginRequiredMiddleware answers first for views that do not name a login page).
LOGINS = (f"{PREFIX}login/?next=", f"{resolve_url(settings.LOGIN_URL)}?next=")


@dataclass(frozen=True)
class Url:
    route: str  # under /admin/, as the patterns spell it: "chat/room/<path:object_id>/change/"
    name: str | None  # the pattern's name (None: the object redirect and the catch-all)
    model: type[models.Model] | None  # whose ModelAdmin serves it, if one does


def _walk(patterns: list[Any], prefix: str = "", model: type[models.Model] | None = None) -> Iterator[Url]:
    for p in patterns:
        route = str(p.pattern).removeprefix("^")
        if isinstance(p, URLResolver):
            served = (getattr(q.callback, "model_admin", None) for q in p.url_patterns if isinstance(q, URLPattern))
            owner = next((m for m in served if m is not None), None)
            yield from _walk(p.url_patterns, prefix + route, owner.model if owner else model)
        else:
            assert isinstance(p, URLPattern)
            owner = getattr(p.callback, "model_admin", None)
            yield Url(prefix + route, p.name, owner.model if owner else model)


URLS = list(_walk(admin.site.get_urls()))

# The admin's login page is the one page open to all (it is where refusals lead): tested on its own.
OPEN = {"login"}
GUARDED = [u for u in URLS if u.name not in OPEN]

PARAM = re.compile(r"<(?:\w+:)?(\w+)>|\(\?P<(\w+)>[^)]*\)")
# Values of the path parameters other than a ModelAdmin's object_id (filled per test from real objects).
PARAM_VALUES: dict[str, tuple[str, ...]] = {
    "action": ("close", "lock", "unlock"),  # the live page's room buttons
}
OBJECT_PARAMS = {"object_id", "id", "content_type_id", "room_id", "reply_id"}


def params(url: Url) -> list[str]:
    return [a or b for a, b in PARAM.findall(url.route)]


def cases() -> Iterator[Any]:
    for url in GUARDED:
        choices = [{}]
        for name in params(url):
            if name in PARAM_VALUES:
                choices = [{**c, name: v} for c in choices for v in PARAM_VALUES[name]]
        for extra in choices:
            tail = "".join(f" {k}={v}" for k, v in extra.items())
            for method in ("GET", "POST"):
                yield pytest.param(method, url, extra, {}, id=f"{method} {PREFIX}{url.route}{tail}")
            if url.name and url.name.endswith("_changelist") and url.model is not None:
                model_admin = admin.site._registry[url.model]
                for _func, action, _desc in model_admin._get_base_actions():
                    data = {"action": action, "_selected_action": "<pk>", "index": "0", "post": "yes"}
                    yield pytest.param("POST", url, extra, data, id=f"POST {PREFIX}{url.route} action={action}")


CASES = list(cases())


# --- the world the URLs would show ---------------------------------------------------------------

SECRETS = ["Zanzibar", "zanzibar-ops", "quentin", "grace", "cloudy-provider", "oracle", "pineapple", "0.123457"]


@dataclass
class World:
    root: User
    mallory: User  # not staff: owns the room, a member of it, asked the question
    objects: dict[type[models.Model], models.Model]


@pytest.fixture
def world() -> World:
    root = User.objects.create_user("root", is_staff=True, is_superuser=True)
    mallory = User.objects.create_user("mallory")
    quentin = User.objects.create_user("quentin", email="quentin@example.com")
    grace = User.objects.create_user("grace")
    provider = Provider.objects.create(name="cloudy-provider", base_url="http://127.0.0.1:9/v1", default_model="m")
    assistant = Assistant.objects.create(handle="oracle", display_name="Oracle", provider=provider)
    room = Room.objects.create(name="Zanzibar", slug="zanzibar-ops", owner=mallory, topic="pineapple plans")
    room.assistants.add(assistant)
    Membership.objects.create(room=room, user=mallory, role=Membership.Role.OWNER)
    membership = Membership.objects.create(room=room, user=quentin)
    ban = Ban.objects.create(room=room, user=grace, by=mallory, reason="pineapple")
    asked = Message.objects.create(
        room=room, seq=1, role=Message.Role.USER, author=mallory, author_name="mallory", text="pineapple?"
    )
    reply = Message.objects.create(
        room=room,
        seq=2,
        role=Message.Role.ASSISTANT,
        assistant=assistant,
        author_name="Oracle",
        reply_to=asked,
        text="pineapple!",
        status=Message.Status.STREAMING,
        prompt_tokens=10,
        tokens=5,
        cost=Decimal("0.123457"),
    )
    Room.objects.filter(pk=room.pk).update(last_seq=2)
    entry = AuditEntry.objects.create(actor=root, actor_name="root", action="lock", room=room, room_name=room.slug)
    mcp_server = McpServer.objects.create(name="pineapple", url="http://127.0.0.1:9/mcp", enabled=True)
    mcp_tool = McpTool.objects.create(
        server=mcp_server,
        name="peel",
        offered_as="pineapple__peel",
        input_schema={"type": "object"},
        listed_at=entry.at,
    )
    mcp_tool.assistants.add(assistant)
    mcp_call = McpCall.objects.create(
        asker=mallory, asker_name="mallory", room=room, room_name=room.name, reply=reply, server=mcp_server,
        server_name="pineapple", tool_name="peel", duration_ms=12, outcome=McpCall.Outcome.OK,
    )  # fmt: skip
    attachment = Attachment.objects.create(
        room=room, uploader=mallory, uploader_name="mallory", message=asked, name="pineapple.txt", kind="document",
        content_type="text/plain", size=10, file=ContentFile(b"pineapple!", "pineapple.txt"), text="pineapple!",
    )  # fmt: skip
    access = {"user_agent": "test", "ip_address": "127.0.0.1", "username": "quentin", "http_accept": "*/*"}
    objects: dict[type[models.Model], models.Model] = {
        User: quentin,
        Group: Group.objects.create(name="grace-group"),
        Provider: provider,
        Assistant: assistant,
        Room: room,
        Membership: membership,
        Ban: ban,
        Message: reply,
        AuditEntry: entry,
        Vote: Vote.objects.create(message=reply, voter=quentin, voter_name="quentin", value=Vote.Value.UP),
        Tool: Tool.objects.create(name="pineapple_lookup", description="d", url="http://127.0.0.1:9/", enabled=True),
        RoomDefaults: RoomDefaults.objects.create(pk=1, budget_tokens=5),
        McpServer: mcp_server,
        McpTool: mcp_tool,
        McpCall: mcp_call,
        Attachment: attachment,
        AccessAttempt: AccessAttempt.objects.create(
            **access, path_info="/accounts/login/", get_data="", post_data="", failures_since_start=1
        ),
        AccessLog: AccessLog.objects.create(**access, path_info="/accounts/login/"),
        AccessFailureLog: AccessFailureLog.objects.create(**access, path_info="/accounts/login/"),
        SocialAccount: SocialAccount.objects.create(user=quentin, provider="corp", uid="u-quentin"),
    }
    missing = [m._meta.label for m in admin.site._registry if m not in objects]
    assert not missing, f"the admin serves {missing}: give the fixture an object of each"
    return World(root, mallory, objects)


def path_of(url: Url, world: World, extra: dict[str, str]) -> str:
    room, reply = world.objects[Room], world.objects[Message]
    values: dict[str, str] = {
        "id": str(world.objects[User].pk),  # the user admin's password page
        "content_type_id": str(ContentType.objects.get_for_model(Room).pk),  # view on site: the room
        "room_id": str(room.pk),
        "reply_id": str(reply.pk),
        "app_label": "chat",
        "url": "no-such-page/",  # the catch-all
        **extra,
    }
    values["object_id"] = str((world.objects[url.model] if url.model else room).pk)

    def fill(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in values, f"{url.route}: no value for the path parameter {name!r}: add one to path_of"
        return values[name]

    path = PREFIX + PARAM.sub(fill, url.route).removesuffix("$")
    assert resolve(path).route == "admin/" + url.route, f"{path} does not resolve to {url.route}"
    return path


def snapshot() -> dict[str, list[dict[str, Any]]]:
    """Every row the admin could change (the chat app, users and groups, axes, the admin log)."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for label in ("chat", "auth", "axes", "admin"):
        for model in apps.get_app_config(label).get_models():
            rows[model._meta.label] = list(model._default_manager.order_by("pk").values())
    return rows


def client_for(who: str, world: World) -> Client:
    client = Client()
    if who == "non-staff":
        client.force_login(world.mallory)
    return client


# --- the refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["non-staff", "anonymous"])
@pytest.mark.parametrize(("method", "url", "extra", "data"), CASES)
def test_refused(world: World, who: str, method: str, url: Url, extra: dict[str, str], data: dict[str, str]) -> None:
    path = path_of(url, world, extra)
    client = client_for(who, world)
    body = {k: (str(world.objects[url.model].pk) if v == "<pk>" and url.model else v) for k, v in data.items()}
    before = snapshot()
    response = client.get(path) if method == "GET" else client.post(path, body)
    assert response.status_code in (302, 403, 404), f"{method} {path}: {response.status_code}"
    if response.status_code == 302:
        back_to_index = url.name == "logout" and response["Location"] == PREFIX  # the admin's own rule
        assert response["Location"].startswith(LOGINS) or back_to_index, response["Location"]
    content = response.content.decode(errors="replace")
    leaked = [s for s in SECRETS if s in content]
    assert not leaked, f"{method} {path} shows {leaked}"
    assert snapshot() == before, f"{method} {path} changed something"


def test_the_login_page_is_the_only_open_door(world: World) -> None:
    for who in ("non-staff", "anonymous"):
        response = client_for(who, world).get(f"{PREFIX}login/")
        assert response.status_code == 200
        content = response.content.decode()
        assert 'name="password"' in content
        assert not [s for s in SECRETS if s in content]
    refused = client_for("non-staff", world).get(f"{PREFIX}login/")
    assert "not authorized to access this page" in refused.content.decode()


# --- staff get an answer from each of them ----------------------------------------------------------

SITE_EXPECTED: dict[str | None, int] = {
    "logout": 405,  # POST only (Django 5)
    "autocomplete": 403,  # refuses any request without a field that has autocomplete (none do)
    "view_on_site": 302,  # to the room's page
    None: 302,  # the object redirect, to its change page (the catch-all: below)
}


def staff_expected(url: Url, world: World) -> int:
    if url.route.endswith("(?P<url>.*)$"):
        return 404
    if url.model is None or url.name is None:
        return SITE_EXPECTED.get(url.name, 200)
    model_admin = admin.site._registry[url.model]
    request = RequestFactory().get("/")
    request.user = world.root
    obj = world.objects[url.model]
    allowed = {
        "changelist": lambda: model_admin.has_view_or_change_permission(request),
        "add": lambda: model_admin.has_add_permission(request),
        "change": lambda: model_admin.has_view_or_change_permission(request, obj),
        "history": lambda: model_admin.has_view_or_change_permission(request, obj),
        "delete": lambda: model_admin.has_delete_permission(request, obj),
        "password_change": lambda: model_admin.has_change_permission(request, obj),
    }
    model_name = f"{url.model._meta.app_label}_{url.model._meta.model_name}_"
    kind = url.name.removeprefix(model_name)
    if kind in allowed:
        return 200 if allowed[kind]() else 403
    return 200  # a page of its own (the live page, the usage page): 200, or 405 for a button (below)


def own_page(url: Url) -> bool:
    """A page of the room admin's own (the live page, the usage page), not a ModelAdmin view."""
    standard = ("changelist", "add", "change", "history", "delete")
    return url.model is Room and url.name is not None and not url.name.endswith(standard)


# The live page's buttons act through the channel layer from a thread of their own
# (database_sync_to_async): their database work must be committed to be seen.
@pytest.mark.parametrize(
    ("url", "extra"),
    [
        pytest.param(c.values[1], c.values[2], id=c.id, marks=[pytest.mark.django_db(transaction=True)])
        if own_page(c.values[1])
        else pytest.param(c.values[1], c.values[2], id=c.id)
        for c in CASES
        if c.values[0] == "GET"
    ],
)
def test_staff_get_an_answer(world: World, url: Url, extra: dict[str, str]) -> None:
    client = Client()
    client.force_login(world.root)
    path = path_of(url, world, extra)
    response = client.get(path)
    expected = staff_expected(url, world)
    if expected == 200 and response.status_code == 405 and own_page(url):
        # A button of the room admin's own pages (the live page's stop, close, lock): POST only.
        assert "POST" in response["Allow"]
        response = client.post(path)
        assert response.status_code in (200, 302), f"POST {path}: {response.status_code}"
        if response.status_code == 302:
            assert not response["Location"].startswith(LOGINS)
        return
    assert response.status_code == expected, f"GET {path}: {response.status_code}, expected {expected}"
    if expected == 302:
        assert not response["Location"].startswith(LOGINS)


# --- the enumeration found what it must --------------------------------------------------------------

MUST = {
    "index",
    "app_list",
    "logout",
    "password_change",
    "view_on_site",
    "chat_room_changelist",
    "chat_room_change",
    "chat_membership_changelist",
    "chat_ban_changelist",
    "chat_auditentry_changelist",
    "chat_message_changelist",
    "chat_provider_changelist",
    "chat_assistant_changelist",
    "chat_tool_changelist",
    "auth_user_changelist",
    "chat_room_live",
    "chat_room_usage",
    "chat_room_usage_csv",
    "chat_room_usage_png",
}
MUST_ACTIONS = {"lock", "unlock", "archive", "close", "stop_all", "export", "kick", "ban", "delete_selected"}


def test_the_enumeration_found_the_known_urls() -> None:
    names = {u.name for u in GUARDED}
    assert names >= MUST, f"not enumerated: {sorted(MUST - names)}"
    assert any(u.route.startswith("chat/room/live/") and params(u) for u in GUARDED), "the live page's buttons"
    actions = {c.values[3]["action"] for c in CASES if c.values[3]}
    assert actions >= MUST_ACTIONS, f"actions not enumerated: {sorted(MUST_ACTIONS - actions)}"
    assert len(GUARDED) > 80 and len(CASES) > 2 * len(GUARDED)
    for url in GUARDED:
        unknown = set(params(url)) - OBJECT_PARAMS - set(PARAM_VALUES) - {"app_label", "url"}
        assert not unknown, f"{url.route}: path parameters without a value: {unknown}"
