"""Agents' HTTP tools in the admin (docs/architecture.md#a-agents). Each add, change and
delete of a tool leaves one audit row, like a provider's: a tool decides where agents
send what rooms hold, and with which key."""

from __future__ import annotations

from django.contrib import admin
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest

from collab.chat.admin.providers import AuditedAdmin
from collab.chat.models import Tool


@admin.register(Tool)
class ToolAdmin(AuditedAdmin):
    list_display = ["name", "url", "enabled", "timeout_s", "api_key_env", "used_by", "updated_at"]
    list_filter = ["enabled", "assistants"]
    search_fields = ["name", "description", "url"]
    readonly_fields = ["created_at", "updated_at"]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    audit_as = "tool"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Tool]:
        return super().get_queryset(request).prefetch_related("assistants")

    @admin.display(description="used by")
    def used_by(self, obj: Tool) -> str:
        return ", ".join(f"@{a.handle}" for a in obj.assistants.all()) or "-"
