"""Pages: sign-up, my rooms, a room, its settings, invites, health. Writes go through
the actions; every page but login, sign-up and /healthz needs a login (middleware)."""

from __future__ import annotations

import asyncio
import hmac
import os

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
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from collab.chat import rendering, shared
from collab.chat.actions import moderation, providers, snapshot
from collab.chat.actions import rooms as room_actions
from collab.chat.errors import ClientError
from collab.chat.models import Assistant, Ban, Membership, Message, Room


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


def _user(request: HttpRequest) -> User:
    assert isinstance(request.user, User)  # LoginRequiredMiddleware ran first
    return request.user


@require_http_methods(["GET", "POST"])
def rooms(request: HttpRequest) -> HttpResponse:
    form = RoomForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            room = room_actions.create_room(
                _user(request),
                form.cleaned_data["name"],
                form.cleaned_data["topic"],
                form.cleaned_data["reply_to_all"],
            )
        except ClientError as exc:
            form.add_error("name", exc.message)
        else:
            return redirect("room", slug=room.slug)
    mine = Room.objects.filter(memberships__user=_user(request)).exclude(status=Room.Status.ARCHIVED).order_by("name")
    return render(
        request, "chat/rooms.html", {"rooms": mine, "form": form, "my_cost": providers.user_cost(_user(request).pk)}
    )


def _membership(request: HttpRequest, slug: str) -> Membership:
    membership = Membership.objects.select_related("room").filter(room__slug=slug, user_id=_user(request).pk).first()
    if membership is None:
        # Same answer for "no such room" and "not yours": slugs are not secrets, but
        # which rooms exist is nobody else's business.
        raise Http404("No such room, or you are not a member.")
    return membership


def _viewer(request: HttpRequest, slug: str) -> tuple[Room, Membership | None]:
    """The room and the user's membership in it; staff who are not members get no
    membership: they see the room read-only. Anyone else gets a 404."""
    membership = Membership.objects.select_related("room").filter(room__slug=slug, user_id=_user(request).pk).first()
    if membership is not None:
        return membership.room, membership
    staff = room_actions.is_staff(_user(request))  # read-only, unless banned from it (the ban page, then)
    the_room = Room.objects.filter(slug=slug).exclude(bans__user=_user(request)).first() if staff else None
    if the_room is None:
        raise Http404("No such room, or you are not a member.")
    return the_room, None


def _banned_page(request: HttpRequest, the_room: Room) -> HttpResponse:
    owner = the_room.owner.get_username() if the_room.owner_id else ""
    return render(request, "chat/banned.html", {"room": the_room, "owner": owner}, status=403)


def _viewer_or_ban_page(request: HttpRequest, slug: str) -> tuple[Room, Membership | None] | HttpResponse:
    """`_viewer`, or the page that says so to a user banned from the room (staff too)."""
    try:
        return _viewer(request, slug)
    except Http404:
        banned = Room.objects.filter(slug=slug, bans__user_id=_user(request).pk).first()
        if banned is not None:
            return _banned_page(request, banned)
        raise


def _refused(request: HttpRequest, heading: str, text: str, back: str = "") -> HttpResponse:
    return render(request, "chat/refused.html", {"heading": heading, "text": text, "back": back}, status=403)


@require_GET
def room(request: HttpRequest, slug: str) -> HttpResponse:
    found = _viewer_or_ban_page(request, slug)
    if isinstance(found, HttpResponse):
        return found
    the_room, membership = found
    recent = snapshot.history(the_room)
    members, members_more = rendering.members_listed(
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
            "assistants": the_room.assistants.all(),
            "room_cost": providers.room_cost(the_room.id),
            "invite_url": request.build_absolute_uri(reverse("join", args=[the_room.invite_token])),
            # Per viewer, for the page's own CSS: Stop shows on the replies this viewer may stop
            # (the articles are the same for every member: `data-asker` on each).
            "me": _user(request).get_username(),
            "stops_any": membership is not None and membership.moderates,
            "max_chars": settings.COLLAB["MAX_MESSAGE_CHARS"],
        },
    )


@require_POST
def join_as_staff(request: HttpRequest, slug: str) -> HttpResponse:
    """The Join button of the read-only view: staff become members by their own act."""
    found = _viewer_or_ban_page(request, slug)
    if isinstance(found, HttpResponse):
        return found
    the_room, membership = found
    if membership is None:
        try:
            room_actions.join_room(_user(request), the_room)
        except ClientError as exc:
            flash.error(request, exc.message)
        else:
            flash.success(request, f"You joined {the_room.name}.")
    return redirect("room", slug=slug)


@require_GET
def room_older(request: HttpRequest, slug: str) -> HttpResponse:
    the_room, _ = _viewer(request, slug)
    try:
        before = int(request.GET.get("before", ""))
    except ValueError:
        return HttpResponse("before must be a number", status=400)
    return HttpResponse(rendering.older_page(snapshot.history(the_room, before), slug))


@require_GET
def message_full(request: HttpRequest, slug: str, message_id: int) -> HttpResponse:
    """One message's article whole, for its "show all" button (a snapshot, a page of
    history or a `final` frame showed it cut). Members of its room (and staff) only."""
    the_room, _ = _viewer(request, slug)
    message = Message.objects.filter(room_id=the_room.pk, pk=message_id).first()
    if message is None:
        raise Http404("No such message in this room.")
    return HttpResponse(rendering.article(message))


@require_http_methods(["GET", "POST"])
def join(request: HttpRequest, token: str) -> HttpResponse:
    the_room = Room.objects.filter(invite_token=token).first()
    if the_room is None:
        return render(request, "chat/join.html", {"invalid": True}, status=404)
    if Membership.objects.filter(room=the_room, user_id=_user(request).pk).exists():
        return redirect("room", slug=the_room.slug)
    if moderation.is_banned(the_room, _user(request)):
        return _banned_page(request, the_room)
    if the_room.status == Room.Status.ARCHIVED:
        return render(request, "chat/join.html", {"room": the_room, "archived": True}, status=403)
    if request.method == "POST":
        try:
            room_actions.join_by_invite(_user(request), token)
        except ClientError as exc:  # banned or archived meanwhile, or the link reset
            flash.error(request, exc.message)
            return render(request, "chat/join.html", {"room": the_room, "refused": True}, status=403)
        return redirect("room", slug=the_room.slug)
    return render(request, "chat/join.html", {"room": the_room})


@require_POST
def leave(request: HttpRequest, slug: str) -> HttpResponse:
    membership = _membership(request, slug)
    try:
        room_actions.leave_room(_user(request), membership.room)
    except ClientError as exc:
        flash.error(request, exc.message)
        return redirect("room", slug=slug)
    flash.success(request, f"You left {membership.room.name}.")
    return redirect("rooms")


class RoomSettingsForm(forms.Form):
    topic = forms.CharField(max_length=500, required=False)
    reply_to_all = forms.BooleanField(required=False, label="Assistants reply to every message")
    assistants = forms.ModelMultipleChoiceField(
        queryset=Assistant.objects.all(), required=False, widget=forms.CheckboxSelectMultiple
    )


# What the settings page's forms may ask (`op`), and of whom: the moderation actions
# check again (moderation.may), these decide only what the page offers and answers.
MODERATOR_OPS = frozenset({"kick", "remove_member", "ban", "unban", "lock", "unlock"})
OWNER_OPS = frozenset({"settings", "reset_invite", "role"})


@require_http_methods(["GET", "POST"])
def room_settings(request: HttpRequest, slug: str) -> HttpResponse:
    """Owners: the settings, the invite link, roles, members and bans, lock. Moderators:
    members and bans, lock. Members: 403, whatever they post."""
    membership = _membership(request, slug)
    the_room = membership.room
    back = reverse("room", args=[slug])
    if not membership.moderates:
        return _refused(request, "Not allowed", "Only the room's owner and its moderators can manage it.", back)
    is_owner = membership.role == Membership.Role.OWNER
    if request.method == "POST":
        op = request.POST.get("op", "settings")
        if op not in MODERATOR_OPS | OWNER_OPS:
            return HttpResponse(f"Unknown operation: {op[:50]}", status=400)
        if op in OWNER_OPS - {"role"} and not is_owner:  # "role": the action itself refuses
            flash.error(request, "Only the room's owner can change its settings.")
            return _settings_page(request, membership, status=403)
        if op == "reset_invite":
            room_actions.reset_invite(the_room)
            flash.success(request, "The old invite link no longer works.")
            return redirect("room_settings", slug=slug)
        if op == "settings":
            form = _settings_form(the_room, request.POST)
            if form.is_valid():
                room_actions.update_room(
                    the_room,
                    topic=form.cleaned_data["topic"],
                    reply_to_all=form.cleaned_data["reply_to_all"],
                    assistant_ids=[a.pk for a in form.cleaned_data["assistants"]],
                )
                flash.success(request, "Saved.")
                return redirect("room", slug=slug)
            return _settings_page(request, membership, form, status=400)
        return _moderate(request, membership, op)
    return _settings_page(request, membership)


def _settings_form(the_room: Room, data: QueryDict | None = None) -> RoomSettingsForm:
    initial = {"topic": the_room.topic, "reply_to_all": the_room.reply_to_all, "assistants": the_room.assistants.all()}
    return RoomSettingsForm(data, initial=initial)


def _moderate(request: HttpRequest, membership: Membership, op: str) -> HttpResponse:
    """One moderation form of the settings page, through actions.moderation (audited).
    A refusal is a flash error: 403 when the action was not allowed, else back to the page."""
    the_room = membership.room
    actor = moderation.Actor(_user(request), request.META.get("REMOTE_ADDR"))
    username = request.POST.get("username", "")
    try:
        if op in ("kick", "remove_member"):
            done = f"{moderation.kick(actor, the_room, username).get_username()} was removed from the room."
        elif op == "ban":
            user = moderation.ban(actor, the_room, username, request.POST.get("reason", ""))
            done = f"{user.get_username()} was banned: removed, and the invite link no longer lets them in."
        elif op == "unban":
            moderation.unban(actor, the_room, username)
            done = f"{username.strip()} is no longer banned (an invite link lets them in again)."
        elif op == "lock":
            locked = moderation.lock(actor, the_room)
            done = "The room is locked: members can read it, nobody can post." if locked else "It was locked already."
        elif op == "unlock":
            unlocked = moderation.unlock(actor, the_room)
            done = "The room is open again." if unlocked else "It was open already."
        else:  # "role"
            role = request.POST.get("role", "")
            moderation.set_role(actor, the_room, username, role)
            done = f"{username.strip()} is now a {role}."
    except ClientError as exc:
        flash.error(request, exc.message)
        if exc.code == "room.not_allowed":
            return _settings_page(request, membership, status=403)
        return redirect("room_settings", slug=the_room.slug)
    flash.success(request, done)
    return redirect("room_settings", slug=the_room.slug)


def _settings_page(
    request: HttpRequest, membership: Membership, form: RoomSettingsForm | None = None, status: int = 200
) -> HttpResponse:
    the_room = membership.room
    is_owner = membership.role == Membership.Role.OWNER
    if is_owner and form is None:
        form = _settings_form(the_room)
    return render(
        request,
        "chat/room_settings.html",
        {
            "room": the_room,
            "is_owner": is_owner,
            "form": form,
            "members": room_actions.members_of(the_room.id, shared.online_sync(the_room.id)),
            "bans": Ban.objects.filter(room=the_room).select_related("user", "by").order_by("-created_at"),
            "invite_url": request.build_absolute_uri(reverse("join", args=[the_room.invite_token])) if is_owner else "",
        },
        status=status,
    )


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
