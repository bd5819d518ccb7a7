"""A room's settings page: the owner's settings (name, topic, assistants, reply mode,
room prompt), members and bans for owners and moderators, the budget for owners. A
rename is moderation's (audited, and sent to the room's open pages)."""

from __future__ import annotations

from django import forms
from django.contrib import messages as flash
from django.db import transaction
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from collab.chat import shared, vote_settings
from collab.chat import view_access as access
from collab.chat.errors import ClientError
from collab.chat.models import Assistant, Ban, Membership, Room
from collab.chat.services import availability, budgets, moderation
from collab.chat.services import rooms as room_actions


class AssistantChoices(forms.ModelMultipleChoiceField):
    """The room's assistants to choose from, each with its model and provider by its handle."""

    def label_from_instance(self, obj: Assistant) -> str:
        return f"@{obj.handle} {obj.display_name}: {obj.model_label} ({obj.provider.name})"


class RoomSettingsForm(forms.Form):
    # Absent from a form made by hand: left as it is (_settings_form); sent, never empty.
    name = forms.CharField(max_length=Room._meta.get_field("name").max_length)
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
    # Only the assistants this room may use (services/availability.py): _settings_form
    # narrows the queryset; anything else posted is the form's error (and audited).
    assistants = AssistantChoices(
        queryset=Assistant.objects.none(),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        error_messages={
            "invalid_choice": "%(value)s: that assistant is not available to this room (staff grant assistants); "
            "nothing was saved.",
            "invalid_pk_value": "%(pk)s: that assistant is not available to this room; nothing was saved.",
        },
    )

    def clean_name(self) -> str:
        try:
            name, _ = room_actions.check_room_name(self.cleaned_data["name"], "")
        except ClientError as exc:
            raise forms.ValidationError(exc.message, code=exc.code) from None
        return name


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
                actor = moderation.Actor(access.user(request), request.META.get("REMOTE_ADDR"))
                try:
                    with transaction.atomic():  # the rename and the rest, or neither
                        moderation.rename(actor, the_room, form.cleaned_data["name"])
                        room_actions.update_room(
                            the_room,
                            topic=form.cleaned_data["topic"],
                            reply_to_all=bool(form.cleaned_data["reply_to_all"]),
                            system_prompt=form.cleaned_data["system_prompt"],
                            assistant_ids=[a.pk for a in form.cleaned_data["assistants"]],
                        )
                except ClientError as exc:  # no longer the owner, say (moderation checks again)
                    flash.error(request, exc.message)
                    return _settings_page(request, membership, status=403)
                flash.success(request, "Saved.")
                return redirect("room", slug=slug)
            if "assistants" in form.errors:
                _audit_refused_assistants(request, the_room)
            return _settings_page(request, membership, form, status=400)
        return _moderate(request, membership, op)
    return _settings_page(request, membership)


def _settings_form(the_room: Room, data: QueryDict | None = None) -> RoomSettingsForm:
    may_use = availability.attachable(the_room).select_related("provider")
    if data is not None and "name" not in data:  # a form made before names could change
        data = data.copy()
        data["name"] = the_room.name
    initial = {
        "name": the_room.name,
        "topic": the_room.topic,
        "reply_to_all": "on" if the_room.reply_to_all else "",
        "system_prompt": the_room.system_prompt,
        "assistants": the_room.assistants.filter(pk__in=may_use.values("pk")),
    }
    form = RoomSettingsForm(data, initial=initial)
    form.fields["assistants"].queryset = may_use  # type: ignore[attr-defined]
    return form


def _audit_refused_assistants(request: HttpRequest, the_room: Room) -> None:
    """A settings form naming an assistant the room may not use: the page never offers
    one, so the form was made by hand. Each such choice leaves an audit row (who, the
    room, which assistant, the address); nothing is saved."""
    may_use = {str(pk) for pk in availability.attachable(the_room).values_list("pk", flat=True)}
    actor = moderation.Actor(access.user(request), request.META.get("REMOTE_ADDR"))
    for raw in request.POST.getlist("assistants"):
        if raw in may_use:
            continue
        # ASCII digits only ("²".isdigit() is True); any other value is shown escaped (a NUL
        # would not store on PostgreSQL).
        number = raw.isascii() and raw.isdigit() and len(raw) < 19
        found = Assistant.objects.filter(pk=int(raw)).first() if number else None
        shown = raw[:40] if raw[:40].isprintable() else ascii(raw[:40])
        detail = f"@{found.handle} (id {found.pk})" if found else f"id {shown}"
        moderation.record(actor, "assistant.refused", the_room, detail=detail)


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
            # Attached, but not available to the room any more: inert, shown so the owner knows.
            "withheld": the_room.assistants.exclude(pk__in=availability.attachable(the_room).values("pk"))
            if is_owner
            else (),
        },
        status=status,
    )
