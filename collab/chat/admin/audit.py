"""The audit log in the admin: read-only for everyone, superusers included; seen by those
given the permission to view it (it holds addresses)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from collab.chat.models import AuditEntry


class ReadOnlyAdmin(admin.ModelAdmin):
    """A record nobody adds to, changes or deletes in the admin (the audit log, votes):
    listed and viewed only."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ["at", "actor_name", "action", "room_name", "target_name", "detail", "address"]
    list_filter = ["action", "at"]
    search_fields = ["actor_name", "room_name", "target_name", "detail", "address"]
    date_hierarchy = "at"
    list_select_related = False
