"""Agents' HTTP tools in the admin (docs/architecture.md, "agents"). Each add, change and
delete of a tool leaves one audit row, like a provider's: a tool decides where agents
send what rooms hold, and with which key."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import models, transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from collab.chat.actions import moderation
from collab.chat.admin.providers import staff_actor
from collab.chat.models import Tool


@admin.register(Tool)
class ToolAdmin(admin.ModelAdmin):
    list_display = ["name", "url", "enabled", "timeout_s", "api_key_env", "used_by", "updated_at"]
    list_filter = ["enabled", "assistants"]
    search_fields = ["name", "description", "url"]
    readonly_fields = ["created_at", "updated_at"]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    def get_queryset(self, request: HttpRequest) -> QuerySet[Tool]:
        return super().get_queryset(request).prefetch_related("assistants")

    @admin.display(description="used by")
    def used_by(self, obj: Tool) -> str:
        return ", ".join(f"@{a.handle}" for a in obj.assistants.all()) or "-"

    def save_model(self, request: HttpRequest, obj: Tool, form: Any, change: bool) -> None:
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            if change and not form.changed_data:
                return  # saved as it was: nothing to record
            fields = ", ".join(form.changed_data) if change else "created"
            moderation.record(staff_actor(request), "tool.change", detail=f"{obj.name}: {fields}"[:500])

    def delete_model(self, request: HttpRequest, obj: Tool) -> None:
        self.delete_queryset(request, Tool.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Tool]) -> None:
        with transaction.atomic():
            names = ", ".join(queryset.values_list("name", flat=True))
            super().delete_queryset(request, queryset)
            moderation.record(staff_actor(request), "tool.delete", detail=names[:500])
