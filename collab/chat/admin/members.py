"""Memberships and bans in the admin. Nothing here changes a membership or a ban
silently: kick, ban, unban and role changes go through actions.moderation (checked,
audited, and the kicked or banned member's sockets closed on every process).

- Memberships: listed, filtered and searched; actions kick, ban, make moderator, make
  member. No add (joining stays explicit: the invite link), no delete (that is a kick),
  and every field is read-only, in its own page and in the room's (MembershipInline).
- Bans: adding one is `moderation.ban` (the member is kicked live); deleting one, alone
  or in bulk, is `moderation.unban`. A ban is read-only once made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from collab.chat.admin.providers import staff_actor
from collab.chat.errors import ClientError
from collab.chat.models import Ban, Membership
from collab.chat.services import moderation


class MembershipInline(admin.TabularInline):
    """The room's members, read-only: roles change through the membership actions
    (audited), never by editing a row here."""

    model = Membership
    extra = 0
    fields = ["user", "role", "joined_at"]
    readonly_fields = ["user", "role", "joined_at"]
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["room", "user", "role", "joined_at"]
    list_filter = ["role", ("room", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["user__username", "room__slug"]
    list_select_related = ["room", "user"]
    readonly_fields = ["room", "user", "role", "joined_at"]
    actions = ["kick", "ban", "make_moderator", "make_member"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a membership ends by a kick (or a ban): audited, and its sockets close

    def _each(
        self, request: HttpRequest, queryset: QuerySet[Membership], act: Callable[[Membership], bool], done: str
    ) -> None:
        changed: list[str] = []
        same: list[str] = []
        chosen = Membership.objects.filter(pk__in=queryset.values("pk")).select_related("room", "user")
        for membership in chosen.order_by("room__slug", "user__username"):
            where = f"{membership.user.get_username()} in {membership.room.slug}"
            try:
                (changed if act(membership) else same).append(where)
            except ClientError as exc:
                self.message_user(request, f"{where}: {exc.message}", messages.ERROR)
        if changed:
            self.message_user(request, f"{done}: {', '.join(changed)}.", messages.SUCCESS)
        if same:
            self.message_user(request, f"Unchanged (already so): {', '.join(same)}.", messages.WARNING)

    @admin.action(description="Kick (remove from the room now; the invite link lets them back)", permissions=["change"])
    def kick(self, request: HttpRequest, queryset: QuerySet[Membership]) -> None:
        actor = staff_actor(request)

        def act(m: Membership) -> bool:
            moderation.kick(actor, m.room, m.user.get_username())
            return True

        self._each(request, queryset, act, "Kicked")

    @admin.action(description="Ban (kick, and bar rejoining, even by invite link)", permissions=["change"])
    def ban(self, request: HttpRequest, queryset: QuerySet[Membership]) -> None:
        actor = staff_actor(request)

        def act(m: Membership) -> bool:
            moderation.ban(actor, m.room, m.user.get_username())
            return True

        self._each(request, queryset, act, "Banned")

    def _set_role(self, request: HttpRequest, queryset: QuerySet[Membership], role: str, done: str) -> None:
        actor = staff_actor(request)

        def act(m: Membership) -> bool:
            if m.role == role:
                return False
            moderation.set_role(actor, m.room, m.user.get_username(), role)
            return True

        self._each(request, queryset, act, done)

    @admin.action(description="Make moderator", permissions=["change"])
    def make_moderator(self, request: HttpRequest, queryset: QuerySet[Membership]) -> None:
        self._set_role(request, queryset, Membership.Role.MODERATOR, "Now moderators")

    @admin.action(description="Make member (not a moderator)", permissions=["change"])
    def make_member(self, request: HttpRequest, queryset: QuerySet[Membership]) -> None:
        self._set_role(request, queryset, Membership.Role.MEMBER, "Now plain members")


class BanForm(forms.ModelForm):
    """A new ban, checked as `moderation.ban` will check it (not the owner, not oneself,
    not twice), so that a refusal is a form error."""

    actor: moderation.Actor | None = None

    class Meta:
        model = Ban
        fields = ["room", "user", "reason"]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        room, user = cleaned.get("room"), cleaned.get("user")
        if room is not None and user is not None and self.actor is not None:
            try:
                moderation.ban_target(self.actor, room, user.get_username())
            except ClientError as exc:
                raise ValidationError(exc.message, code=exc.code) from None
        return cleaned


@admin.register(Ban)
class BanAdmin(admin.ModelAdmin):
    list_display = ["room", "user", "by", "reason", "created_at"]
    list_filter = [("room", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["room__slug", "user__username", "reason"]
    list_select_related = ["room", "user", "by"]
    raw_id_fields = ["room", "user"]
    form = BanForm

    def get_fields(self, request: HttpRequest, obj: Ban | None = None) -> list[Any]:
        return ["room", "user", "reason"] if obj is None else ["room", "user", "by", "reason", "created_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Ban | None = None) -> list[str]:
        return [] if obj is None else ["room", "user", "by", "reason", "created_at"]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        return type(form.__name__, (form,), {"actor": staff_actor(request)})

    def save_model(self, request: HttpRequest, obj: Ban, form: Any, change: bool) -> None:
        if change:
            return  # read-only once made
        try:
            moderation.ban(staff_actor(request), obj.room, obj.user.get_username(), obj.reason)
        except ClientError as exc:  # refused since the form was checked (another staff member was quicker)
            self.message_user(request, f"{obj.user.get_username()} in {obj.room.slug}: {exc.message}", messages.ERROR)
            return
        made = Ban.objects.get(room=obj.room, user=obj.user)
        obj.pk, obj.by, obj.created_at = made.pk, made.by, made.created_at

    def response_add(self, request: HttpRequest, obj: Ban, post_url_continue: str | None = None) -> HttpResponse:
        if obj.pk is None:  # refused in save_model: back to the list, with the error
            return HttpResponseRedirect(reverse("admin:chat_ban_changelist"))
        return super().response_add(request, obj, post_url_continue)

    def delete_model(self, request: HttpRequest, obj: Ban) -> None:
        self._unban(request, [obj])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Ban]) -> None:
        self._unban(request, list(queryset.select_related("room", "user")))

    def _unban(self, request: HttpRequest, bans: list[Ban]) -> None:
        actor = staff_actor(request)
        for ban in bans:
            try:
                moderation.unban(actor, ban.room, ban.user.get_username())
            except ClientError as exc:
                self.message_user(
                    request, f"{ban.user.get_username()} in {ban.room.slug}: {exc.message}", messages.ERROR
                )
