"""Members' files in the admin (docs/architecture/files.md): every upload, posted or not,
read-only, with its room, uploader, kind and size; and a message's files, inline on its
page. Staff may delete a file (audited, as a message's deletion is): its row goes, and its
stored bytes follow once that commits (file_models: the post_delete receiver). Deleting
a message here deletes its files with it (the foreign key cascades)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.defaultfilters import filesizeformat
from django.utils.html import format_html

from collab.chat.admin.providers import staff_actor
from collab.chat.file_models import Attachment
from collab.chat.services import moderation

SHOWN = ("name", "kind", "content_type", "human_size", "width", "height", "uploader_name", "created_at")


class PostedFilter(admin.SimpleListFilter):
    title = "posted"
    parameter_name = "posted"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "posted"), ("no", "not posted (an upload never sent)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Attachment]) -> QuerySet[Attachment]:
        if self.value() in ("yes", "no"):
            return queryset.filter(message__isnull=self.value() == "no")
        return queryset


def _size(obj: Attachment) -> str:
    return filesizeformat(obj.size)


def _link(obj: Attachment) -> str:
    if obj.pk is None:
        return ""
    return format_html('<a href="{}" target="_blank" rel="noopener">open</a>', obj.get_absolute_url())


class AttachmentInline(admin.TabularInline):  # type: ignore[type-arg]
    """A message's files, on its admin page: read, opened, never changed here."""

    model = Attachment
    fk_name = "message"
    fields = (*SHOWN, "link")
    readonly_fields = (*SHOWN, "link")
    extra = 0
    can_delete = False
    ordering = ["position"]

    @admin.display(description="size")
    def human_size(self, obj: Attachment) -> str:
        return _size(obj)

    @admin.display(description="file")
    def link(self, obj: Attachment) -> str:
        return _link(obj)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Attachment)
class AttachmentAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "room", "kind", "human_size", "uploader_name", "posted", "created_at"]
    list_filter = ["kind", PostedFilter, "created_at"]
    search_fields = ["name", "uploader_name", "room__slug", "room__name"]
    list_select_related = ["room"]
    ordering = ["-created_at", "-id"]
    fields = ("room", "message", "position", *SHOWN, "size", "extract_ms", "link")
    readonly_fields = ("room", "message", "position", *SHOWN, "size", "extract_ms", "link")

    @admin.display(description="size", ordering="size")
    def human_size(self, obj: Attachment) -> str:
        return _size(obj)

    @admin.display(description="posted", boolean=True, ordering="message")
    def posted(self, obj: Attachment) -> bool:
        return obj.message_id is not None

    @admin.display(description="file")
    def link(self, obj: Attachment) -> str:
        return _link(obj)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def delete_model(self, request: HttpRequest, obj: Attachment) -> None:
        self.delete_queryset(request, Attachment.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Attachment]) -> None:
        with transaction.atomic():
            for f in queryset.select_related("room"):
                moderation.record(staff_actor(request), "file.delete", f.room, detail=f"{f.name} ({f.pk})")
            queryset.delete()  # each row's bytes follow on commit (its post_delete receiver)
