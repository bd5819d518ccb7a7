"""A room's settings page: the owner's settings (name, topic, assistants, reply mode,
room prompt), members and bans for owners and moderators, the budget for owners."""

from __future__ import annotations

from django import forms
from django.contrib import messages as flash
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from collab.chat import shared, vote_settings
from collab.chat import view_access as access
from collab.chat.errors import ClientError
from collab.chat.models import Assistant, Ban, Membership, Room
from collab.chat.services import budgets, moderation
from collab.chat.services import rooms as room_actions


class RoomSettingsForm(forms.Form):
    topic = forms.CharField(max_length=500, required=False)
    # Reply mode (docs/wire.md, "Room settings"): "on" is every message, as the checkbox it was.
    reply_to_all = forms.TypedChoiceField(
        label="Assistants reply",
        choices=[("", "on mention (@handle, @all)"), ("on", "to every message")],
        coerce=bool,  # "on": True; empty stays "" (falsy): bool() where it is used
        required=False,
        widget=forms.RadioSelect,
    )
    system_prompt = forms.CharField(
        max_length=4000,
        required=False,
        label="Room system prompt",
        help_text="Every assistant of this room is given it, from the next reply on.",
        widget=forms.Textarea(attrs={"rows": 4}),
    )
    assistants = forms.ModelMultipleChoiceField(
        queryset=Assistant.objects.all(), required=False, widget=forms.CheckboxSelectMultiple
    )


# What the settings page's forms may ask (`op`), and of whom: the moderation actions
# check again (moderation.may), these decide only what the page offers and answers.
MODERATOR_OPS = frozenset({"kick", "remove_member", "ban", "unban", "lock", "unlock"})
OWNER_OPS = frozenset({"settings", "reset_invite", "role", "votes"})


@require_http_methods(["GET", "POST"])
def room_settings(request: HttpRequest, slug: str) -> HttpResponse:
    """Owners: the settings, the invite link, roles, members and bans, lock. Moderators:
    members and bans, lock. Members: 403, whatever they post."""
    membership = access.membership(request, slug)
    the_room = membership.room
    back = reverse("room", args=[slug])
    if not membership.moderates:
        return access.refused(request, "Not allowed", "Only the room's owner and its moderators can manage it.", back)
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
        if op == "votes":  # who may vote, the approval rule, rejected replies (vote_settings.py)
            saved = vote_settings.post(request, the_room)
            if isinstance(saved, HttpResponse):
                return saved
            return _settings_page(request, membership, status=400, votes_form=saved)
        if op == "settings":
            form = _settings_form(the_room, request.POST)
            if form.is_valid():
                room_actions.update_room(
                    the_room,
                    topic=form.cleaned_data["topic"],
                    reply_to_all=bool(form.cleaned_data["reply_to_all"]),
                    system_prompt=form.cleaned_data["system_prompt"],
                    assistant_ids=[a.pk for a in form.cleaned_data["assistants"]],
                )
                flash.success(request, "Saved.")
                return redirect("room", slug=slug)
            return _settings_page(request, membership, form, status=400)
        return _moderate(request, membership, op)
    return _settings_page(request, membership)


def _settings_form(the_room: Room, data: QueryDict | None = None) -> RoomSettingsForm:
    initial = {
        "topic": the_room.topic,
        "reply_to_all": "on" if the_room.reply_to_all else "",
        "system_prompt": the_room.system_prompt,
        "assistants": the_room.assistants.all(),
    }
    return RoomSettingsForm(data, initial=initial)


def _moderate(request: HttpRequest, membership: Membership, op: str) -> HttpResponse:
    """One moderation form of the settings page, through actions.moderation (audited).
    A refusal is a flash error: 403 when the action was not allowed, else back to the page."""
    the_room = membership.room
    actor = moderation.Actor(access.user(request), request.META.get("REMOTE_ADDR"))
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
    request: HttpRequest,
    membership: Membership,
    form: RoomSettingsForm | None = None,
    status: int = 200,
    votes_form: vote_settings.VoteSettingsForm | None = None,
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
            "budget": budgets.usage(the_room) if is_owner else None,
            "votes_form": (votes_form or vote_settings.form_for(the_room)) if is_owner else None,
        },
        status=status,
    )
