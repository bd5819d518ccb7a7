"""Pages: sign-up, my rooms, a room, its settings, invites, health. Writes go through
the actions; every page but login, sign-up and /healthz needs a login (middleware)."""

from __future__ import annotations

import asyncio
import functools
import hmac
import os
import re
from pathlib import Path

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django import forms
from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth import login
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.forms import UserCreationForm
from django.contrib.auth.models import User
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from collab.chat import attached, broadcast, history_views, markup, rendering, room_frames, shared
from collab.chat import view_access as access
from collab.chat.errors import ClientError
from collab.chat.models import Membership, Message, Room
from collab.chat.services import availability, budgets, moderation, panels, providers, snapshot, unread
from collab.chat.services import rooms as room_actions
from collab.llm.local import MODEL_LABEL


@login_not_required
@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    form: UserCreationForm[User] = UserCreationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        wanted = request.GET.get("next", "")
        safe = url_has_allowed_host_and_scheme(wanted, {request.get_host()}, require_https=request.is_secure())
        return redirect(wanted if wanted and safe else "rooms")  # never off this site
    return render(request, "registration/signup.html", {"form": form})


class RoomForm(forms.Form):
    name = forms.CharField(max_length=100)
    topic = forms.CharField(max_length=500, required=False)
    reply_to_all = forms.BooleanField(required=False, label="Assistants reply to every message")


@require_http_methods(["GET", "POST"])
def rooms(request: HttpRequest) -> HttpResponse:
    form = RoomForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            room = room_actions.create_room(
                access.user(request),
                form.cleaned_data["name"],
                form.cleaned_data["topic"],
                form.cleaned_data["reply_to_all"],
            )
        except ClientError as exc:
            form.add_error("name", exc.message)
        else:
            return redirect("room", slug=room.slug)
    me = access.user(request)
    mine = Room.objects.filter(memberships__user=me).exclude(status=Room.Status.ARCHIVED).order_by("name")
    counts = {r.room_id: r for r in unread.summary(me.pk, me.get_username())}  # unread and mentions
    for r in mine:
        r.unread = counts.get(r.pk)  # type: ignore[attr-defined]
    return render(request, "chat/rooms.html", {"rooms": mine, "form": form, "my_cost": providers.user_cost(me.pk)})


@require_GET
def room(request: HttpRequest, slug: str) -> HttpResponse:
    if "at" in request.GET:  # a message in context (a search result links there): history_views
        return history_views.context(request, slug)
    found = access.viewer_or_ban_page(request, slug)
    if isinstance(found, HttpResponse):
        return found
    the_room, membership = found
    me = access.user(request)
    if membership is not None and request.method == "GET":  # opening it marks it read (services/unread.py): not a HEAD
        moved, state = unread.mark_read(membership, None)
        membership.read_seq = state.read
        if moved:  # the member's other tabs and devices: their sidebars
            broadcast.to_user_after_commit(me.pk, unread.read_event(state))
    recent = snapshot.history(the_room, user_id=me.pk)
    members, members_more = room_frames.members_listed(
        room_actions.members_of(the_room.id, shared.online_sync(the_room.id))
    )
    return render(
        request,
        "chat/room.html",
        {
            "room": the_room,
            "membership": membership,
            "read_only": membership is None,
            "recent": recent.articles,
            "has_older": recent.has_older,
            "oldest_seq": recent.oldest_seq,
            "members": members,
            "members_more": members_more,
            "panels": panels.render_all(the_room.id, access.user(request).pk, False),  # pinned messages ...
            # What may reply here, each with its model and provider (the side list).
            "assistants": availability.available(the_room, the_room.assistants.select_related("provider")),
            "room_cost": providers.room_cost(the_room.id),
            "budget": budgets.usage(the_room),  # the header's "left this month" (its own budget, or the default)
            "invite_url": request.build_absolute_uri(reverse("join", args=[the_room.invite_token])),
            # Per viewer, for the page's own CSS: Stop shows on the replies this viewer may stop
            # (the articles are the same for every member: `data-asker` on each).
            "me": access.user(request).get_username(),
            "stops_any": membership is not None and membership.moderates,
            "max_chars": settings.COLLAB["MAX_MESSAGE_CHARS"],
            # The sidebar: the viewer's rooms with their unread counts (the socket keeps it live).
            "rooms_list": unread.list_html(unread.summary(me.pk, me.get_username()), the_room.pk),
        },
    )


@require_POST
def join_as_staff(request: HttpRequest, slug: str) -> HttpResponse:
    """The Join button of the read-only view: staff become members by their own act."""
    found = access.viewer_or_ban_page(request, slug)
    if isinstance(found, HttpResponse):
        return found
    the_room, membership = found
    if membership is None:
        try:
            room_actions.join_room(access.user(request), the_room)
        except ClientError as exc:
            flash.error(request, exc.message)
        else:
            flash.success(request, f"You joined {the_room.name}.")
    return redirect("room", slug=slug)


@require_GET
def room_older(request: HttpRequest, slug: str) -> HttpResponse:
    the_room, _ = access.viewer(request, slug)
    try:
        before = int(request.GET.get("before", ""))
    except ValueError:
        return HttpResponse("before must be a number", status=400)
    return HttpResponse(rendering.older_page(snapshot.history(the_room, before, access.user(request).pk), slug))


@require_GET
def message_full(request: HttpRequest, slug: str, message_id: int) -> HttpResponse:
    """One message's article whole, for its "show all" button (a snapshot, a page of
    history or a `final` frame showed it cut). Members of its room (and staff) only."""
    the_room, _ = access.viewer(request, slug)
    mine = Message.objects.visible_to(access.user(request).pk)  # not others' personal replies
    mine = attached.with_files(mine.select_related("recipient"))
    message = mine.filter(room_id=the_room.pk, pk=message_id).first()
    if message is None:
        raise Http404("No such message in this room.")
    return HttpResponse(rendering.article(message))


@require_http_methods(["GET", "POST"])
def join(request: HttpRequest, token: str) -> HttpResponse:
    the_room = Room.objects.filter(invite_token=token).first()
    if the_room is None:
        return render(request, "chat/join.html", {"invalid": True}, status=404)
    if Membership.objects.filter(room=the_room, user_id=access.user(request).pk).exists():
        return redirect("room", slug=the_room.slug)
    if moderation.is_banned(the_room, access.user(request)):
        return access.banned_page(request, the_room)
    if the_room.status == Room.Status.ARCHIVED:
        return render(request, "chat/join.html", {"room": the_room, "archived": True}, status=403)
    if request.method == "POST":
        try:
            room_actions.join_by_invite(access.user(request), token)
        except ClientError as exc:  # banned or archived meanwhile, or the link reset
            flash.error(request, exc.message)
            return render(request, "chat/join.html", {"room": the_room, "refused": True}, status=403)
        return redirect("room", slug=the_room.slug)
    return render(request, "chat/join.html", {"room": the_room})


@require_POST
def leave(request: HttpRequest, slug: str) -> HttpResponse:
    membership = access.membership(request, slug)
    try:
        room_actions.leave_room(access.user(request), membership.room)
    except ClientError as exc:
        flash.error(request, exc.message)
        return redirect("room", slug=slug)
    flash.success(request, f"You left {membership.room.name}.")
    return redirect("rooms")


_health_channels: dict[int, str] = {}  # one per layer: a new channel per call stays subscribed (a leak)


async def _layer_answers() -> bool:
    layer = get_channel_layer()
    if layer is None:
        return False
    channel = _health_channels.get(id(layer))
    if channel is None:
        channel = _health_channels[id(layer)] = await layer.new_channel()
    await layer.send(channel, {"type": "health.ping"})
    async with asyncio.timeout(2):
        message = await layer.receive(channel)
    return bool(message.get("type") == "health.ping")


@login_not_required
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus metrics of this process: for staff, or with `Authorization: Bearer
    $COLLAB_METRICS_TOKEN` (a scraper has no session)."""
    token = os.environ.get("COLLAB_METRICS_TOKEN", "")
    offered = request.headers.get("Authorization", "")
    allowed = (token and hmac.compare_digest(offered, f"Bearer {token}")) or getattr(request.user, "is_staff", False)
    if not allowed:
        return HttpResponse("Metrics need a staff login or the metrics token.", status=403)
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)


@login_not_required
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, bool] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = True
    except Exception:
        checks["database"] = False
    try:
        checks["channel_layer"] = async_to_sync(_layer_answers)()
    except Exception:
        checks["channel_layer"] = False
    ok = all(checks.values())
    return JsonResponse({"ok": ok, **checks}, status=200 if ok else 503)


# --- the README's provider settings, served (the embedded model's label links here) ---------

PROVIDERS_HEADING = "Pointing at a model provider"  # README.md, "Configuration"
_HEADING = re.compile(r"(#{1,6})\s+(.*?)\s*$")


def readme_section(text: str, heading: str) -> str | None:
    """The Markdown under `heading` in `text`, up to the next heading of its level or
    above (a `#` inside a fence is code, not a heading); None without that heading."""
    level, body, fenced = 0, [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        found = None if fenced else _HEADING.fullmatch(line)
        if found and level and len(found.group(1)) <= level:
            break
        if level:
            body.append(line)
        elif found and found.group(2) == heading:
            level = len(found.group(1))
    return "\n".join(body).strip() if level else None


@functools.lru_cache(maxsize=2)
def _providers_html(path: Path, _mtime: float) -> str | None:
    section = readme_section(path.read_text(encoding="utf-8"), PROVIDERS_HEADING)
    return None if section is None else markup.render_markdown(section)


@login_not_required
@require_GET
def provider_docs(request: HttpRequest) -> HttpResponse:
    """README's "Pointing at a model provider" as a page of this server (no network
    needed): where the embedded local model's label links (templates/chat/_model_label.html)."""
    readme = Path(settings.BASE_DIR) / "README.md"
    try:
        html = _providers_html(readme, readme.stat().st_mtime)
    except OSError:
        html = None
    if html is None:
        raise Http404("This installation has no README.md with its provider settings.")
    anchor = PROVIDERS_HEADING.lower().replace(" ", "-")
    context = {"heading": PROVIDERS_HEADING, "anchor": anchor, "html": html, "embedded": MODEL_LABEL}
    return render(request, "chat/docs.html", context)
