"""Rooms and messages in the admin (memberships and bans: members.py).

The room list shows each room's status, members, members online now (the shared state:
Redis, whichever process holds the sockets), messages, replies streaming now, tokens and
cost this calendar month, and the last activity. Every figure but "online now" is an
annotation of the one page query (correlated subqueries: a page of rooms is a handful of
queries, whatever its length; tests/test_admin_rooms.py counts them); "online now" is
one shared-state call per room on the page.

The actions (lock, unlock, archive, unarchive, close now, stop all replies, export
transcripts) act on one room or many, each through actions.moderation (which checks,
writes the audit row and reaches the sockets on every process); a refusal is shown as
an error. A room's status changes only through them: it is read-only in the form.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.contrib import admin, messages
from django.db import transaction
from django.db.models import (
    Count,
    DecimalField,
    F,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce
from django.http import FileResponse, HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.urls import URLPattern, reverse
from django.utils import timezone

from collab.chat import shared
from collab.chat.admin import live, usage
from collab.chat.admin.files import AttachmentInline
from collab.chat.admin.members import MembershipInline
from collab.chat.admin.providers import staff_actor
from collab.chat.errors import ClientError
from collab.chat.models import Membership, Message, Room
from collab.chat.services import availability, budgets, moderation, transcripts

Act = Callable[[moderation.Actor, Room], bool | None]


def month_start(now: datetime | None = None) -> datetime:
    """The first instant of this calendar month, in the site's time zone (TIME_ZONE)."""
    local = timezone.localtime(now)
    return local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _per_room(rows: QuerySet[Any], value: Any, output: Any) -> Coalesce:
    """`value` aggregated over `rows` of the outer room, 0 when it has none."""
    sub = rows.filter(room=OuterRef("pk")).order_by().values("room").annotate(v=value).values("v")[:1]
    return Coalesce(Subquery(sub, output_field=output), Value(0), output_field=output)


def annotate_rooms(rooms: QuerySet[Room], since: datetime) -> QuerySet[Room]:
    """The figures of the room list, as annotations (one query for the page)."""
    month = Message.objects.filter(created_at__gte=since)
    tokens = Coalesce(F("tokens"), 0) + Coalesce(F("prompt_tokens"), 0)
    money: DecimalField[Decimal, Decimal] = DecimalField(max_digits=16, decimal_places=6)
    return rooms.select_related("owner").annotate(
        n_members=_per_room(Membership.objects.all(), Count("pk"), IntegerField()),
        n_messages=_per_room(Message.objects.all(), Count("pk"), IntegerField()),
        n_streaming=_per_room(Message.objects.filter(status=Message.Status.STREAMING), Count("pk"), IntegerField()),
        month_tokens=_per_room(month, Sum(tokens, output_field=IntegerField()), IntegerField()),
        month_cost=_per_room(month, Sum("cost", output_field=money), money),
        last_activity=Subquery(Message.objects.filter(room=OuterRef("pk")).order_by("-seq").values("created_at")[:1]),
    )


class Online:
    """Members online now, per room, for one page: one shared-state call per room; after
    a failure (Redis away) the rest of the page shows "?" instead of waiting again."""

    def __init__(self) -> None:
        self.failed = False
        self.__name__ = "online_now"  # the column's class in the list: field-online_now

    def __call__(self, room: Room) -> int | str:
        if self.failed:
            return "?"
        try:
            return len(shared.online_sync(room.pk))
        except shared.UNAVAILABLE:
            self.failed = True
            return "?"


class StreamingFilter(admin.SimpleListFilter):
    title = "replies streaming now"
    parameter_name = "streaming"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Sequence[tuple[str, str]]:
        return [("yes", "some"), ("no", "none")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Room]) -> QuerySet[Room]:
        if self.value() == "yes":
            return queryset.filter(Q(n_streaming__gt=0))
        if self.value() == "no":
            return queryset.filter(Q(n_streaming=0))
        return queryset


class ActivityFilter(admin.SimpleListFilter):
    title = "last activity"
    parameter_name = "active"
    SPANS = {"1": ("in the last 24 hours", 1), "7": ("in the last 7 days", 7), "30": ("in the last 30 days", 30)}

    def lookups(self, request: HttpRequest, model_admin: Any) -> Sequence[tuple[str, str]]:
        return [*((k, label) for k, (label, _) in self.SPANS.items()), ("idle", "none in 30 days")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Room]) -> QuerySet[Room]:
        value = self.value()
        if value in self.SPANS:
            return queryset.filter(Q(last_activity__gte=timezone.now() - timedelta(days=self.SPANS[value][1])))
        if value == "idle":
            since = timezone.now() - timedelta(days=30)
            return queryset.exclude(Q(last_activity__gte=since))
        return queryset


@admin.register(Room)
class RoomAdmin(admin.ModelAdmin):
    list_filter = ["status", StreamingFilter, ActivityFilter, "created_at"]
    search_fields = ["name", "slug", "owner__username"]
    filter_horizontal = ["assistants"]
    readonly_fields = ["status", "last_seq", "invite_token", "created_at"]
    inlines = [MembershipInline]

    def delete_model(self, request: HttpRequest, obj: Room) -> None:
        self.delete_queryset(request, Room.objects.filter(pk=obj.pk))

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        """Memberships cannot be deleted one by one in the admin (a removal is a kick), but
        they go with their room."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        perms_needed.discard(Membership._meta.verbose_name)
        return deleted, counts, perms_needed, protected

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Room]) -> None:
        """A deleted room's open sockets close first (room.closed, 4403), on every process;
        each deletion is audited (the row keeps the room's slug)."""
        for room in queryset:
            moderation.delete(staff_actor(request), room)

    actions = ["lock", "unlock", "archive", "unarchive", "close", "stop_all", "export"]
    list_per_page = 50

    def get_urls(self) -> list[URLPattern]:
        return [*live.urls(self.admin_site), *usage.urls(self.admin_site), *super().get_urls()]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Room]:
        return annotate_rooms(super().get_queryset(request), month_start())

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        online = admin.display(description="online now")(Online())
        return [
            "name",
            "slug",
            "owner",
            "room_status",
            "member_count",
            online,
            "message_count",
            "streaming_count",
            "tokens_this_month",
            "cost_this_month",
            "last_activity",
        ]

    def get_inlines(self, request: HttpRequest, obj: Room | None = None) -> list[Any]:
        return list(self.inlines) if obj is not None else []  # a new room's only member: its owner

    def get_readonly_fields(self, request: HttpRequest, obj: Room | None = None) -> list[str]:
        # The owner's role lives in its membership: a new owner is not one form field away.
        return [*self.readonly_fields, "owner"] if obj is not None else list(self.readonly_fields)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The room's page, with its actions as buttons (those its status allows)."""
        status = (
            Room.objects.filter(pk=object_id).values_list("status", flat=True).first() if object_id.isdigit() else None
        )
        by_status: dict[str | None, list[tuple[str, str]]] = {
            Room.Status.OPEN: [("lock", "Lock"), ("archive", "Archive")],
            Room.Status.LOCKED: [("unlock", "Unlock"), ("archive", "Archive")],
            Room.Status.ARCHIVED: [("unarchive", "Unarchive")],
        }
        buttons = [
            *by_status.get(status, []),
            ("close", "Close now"),
            ("stop_all", "Stop all replies"),
            ("export", "Export transcript"),
        ]
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), "room_actions": buttons})

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        room = form.instance
        inert = room.assistants.exclude(pk__in=availability.attachable(room).values("pk"))
        if inert:  # attached, but not granted to this room: it would never reply (say so, keep it)
            handles = ", ".join(f"@{a.handle}" for a in inert)
            self.message_user(
                request,
                f"{handles}: attached, but not available to this room, so it does not reply here. Grant it "
                "on the assistant's page (rooms or groups granted), or make it available to every room.",
                messages.WARNING,
            )

    def save_model(self, request: HttpRequest, obj: Room, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if change and {"budget_tokens", "budget_cost"} & set(form.changed_data):  # audited, shown live
            budgets.staff_changed(staff_actor(request), obj, form.initial)
        if change and "name" in form.changed_data:  # audited, shown live
            moderation.renamed(staff_actor(request), obj, form.initial["name"])
        if not change:  # a room added here has its owner as a member, as one created on the site
            Membership.objects.get_or_create(room=obj, user=obj.owner, defaults={"role": Membership.Role.OWNER})

    @admin.display(description="status", ordering="status")
    def room_status(self, room: Room) -> str:
        return room.status  # open, locked, archived: the choices' long labels are the form's

    @admin.display(description="members", ordering="n_members")
    def member_count(self, room: Room) -> int:
        return int(room.n_members)  # type: ignore[attr-defined]

    @admin.display(description="messages", ordering="n_messages")
    def message_count(self, room: Room) -> int:
        return int(room.n_messages)  # type: ignore[attr-defined]

    @admin.display(description="replies streaming", ordering="n_streaming")
    def streaming_count(self, room: Room) -> int:
        return int(room.n_streaming)  # type: ignore[attr-defined]

    @admin.display(description="tokens this month (prompt + reply)", ordering="month_tokens")
    def tokens_this_month(self, room: Room) -> int:
        return int(room.month_tokens)  # type: ignore[attr-defined]

    @admin.display(description="cost this month (USD)", ordering="month_cost")
    def cost_this_month(self, room: Room) -> str:
        return f"{Decimal(room.month_cost):.4f}"  # type: ignore[attr-defined]

    @admin.display(description="last activity", ordering="last_activity", empty_value="never")
    def last_activity(self, room: Room) -> datetime | None:
        return room.last_activity  # type: ignore[attr-defined, no-any-return]

    # --- actions (each through actions.moderation: checked, audited, live) -------------------

    def _each(
        self, request: HttpRequest, queryset: QuerySet[Room], act: Act, done: str, unchanged: str = ""
    ) -> HttpResponse | None:
        """Run `act` on every chosen room; say what it did, what it left, what it refused."""
        actor = staff_actor(request)
        changed: list[str] = []
        same: list[str] = []
        rooms = list(Room.objects.filter(pk__in=queryset.values("pk")).order_by("slug"))
        for room in rooms:
            try:
                result = act(actor, room)
            except ClientError as exc:
                self.message_user(request, f"{room.slug}: {exc.message}", messages.ERROR)
                continue
            (same if result is False else changed).append(room.slug)
        if changed:
            self.message_user(request, f"{done}: {', '.join(changed)}.", messages.SUCCESS)
        if same:
            self.message_user(request, f"{unchanged}: {', '.join(same)}.", messages.WARNING)
        return self._back(request, rooms)

    def _back(self, request: HttpRequest, rooms: list[Room]) -> HttpResponse | None:
        """From a room's own page (its buttons), back to that page; else the list."""
        if request.POST.get("from") == "change" and len(rooms) == 1:
            return HttpResponseRedirect(reverse("admin:chat_room_change", args=[rooms[0].pk]))
        return None

    @admin.action(description="Lock (members read, nobody posts)", permissions=["change"])
    def lock(self, request: HttpRequest, queryset: QuerySet[Room]) -> HttpResponse | None:
        return self._each(request, queryset, moderation.lock, "Locked", "Already locked")

    @admin.action(description="Unlock", permissions=["change"])
    def unlock(self, request: HttpRequest, queryset: QuerySet[Room]) -> HttpResponse | None:
        return self._each(request, queryset, moderation.unlock, "Unlocked", "Already open")

    @admin.action(description="Archive (read-only, hidden from members' lists)", permissions=["change"])
    def archive(self, request: HttpRequest, queryset: QuerySet[Room]) -> HttpResponse | None:
        return self._each(request, queryset, moderation.archive, "Archived", "Already archived")

    @admin.action(description="Unarchive", permissions=["change"])
    def unarchive(self, request: HttpRequest, queryset: QuerySet[Room]) -> HttpResponse | None:
        return self._each(request, queryset, moderation.unarchive, "Unarchived", "Not archived")

    @admin.action(description="Close now (disconnect every open socket)", permissions=["change"])
    def close(self, request: HttpRequest, queryset: QuerySet[Room]) -> HttpResponse | None:
        return self._each(request, queryset, moderation.close, "Closed (every open socket was told and disconnected)")

    @admin.action(description="Stop all replies streaming now", permissions=["change"])
    def stop_all(self, request: HttpRequest, queryset: QuerySet[Room]) -> HttpResponse | None:
        return self._each(request, queryset, moderation.stop_all, "Stopped every reply streaming in")

    def has_export_permission(self, request: HttpRequest) -> bool:
        """Every message of the rooms: the permission to view rooms and to view messages."""
        return bool(request.user.has_perm("chat.view_room") and request.user.has_perm("chat.view_message"))

    @admin.action(description="Export transcripts (zip: Markdown and JSON Lines per room)", permissions=["export"])
    def export(self, request: HttpRequest, queryset: QuerySet[Room]) -> HttpResponseBase | None:
        rooms = Room.objects.filter(pk__in=queryset.values("pk"))
        try:
            archive = transcripts.export(staff_actor(request), rooms)
        except ClientError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return None
        name = f"collab-transcripts-{timezone.now():%Y%m%d-%H%M%S}.zip"
        return FileResponse(archive, as_attachment=True, filename=name, content_type="application/zip")


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    """Messages are the room's record: staff read them here, and may delete one (audited);
    nobody edits what someone said, or a reply's text, status or cost."""

    list_display = ["room", "seq", "author_name", "role", "status", "tokens", "ttft_ms", "tps", "created_at"]
    list_filter = ["role", "status"]
    search_fields = ["text", "author_name"]
    raw_id_fields = ["author", "reply_to"]
    inlines = [AttachmentInline]  # its files, read-only (admin/files.py); deleting it deletes them

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def delete_model(self, request: HttpRequest, obj: Message) -> None:
        self.delete_queryset(request, Message.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        with transaction.atomic():
            for room_id, seq in queryset.values_list("room_id", "seq"):
                room = Room.objects.filter(pk=room_id).first()
                moderation.record(staff_actor(request), "message.delete", room, detail=f"#{seq}")
            queryset.delete()
