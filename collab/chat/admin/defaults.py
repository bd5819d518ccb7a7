"""The room defaults in the admin (one row): the monthly budget every room without one of
its own gets (services/budgets.py), set by staff; each change audited."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse

from collab.chat.admin.providers import AuditedAdmin
from collab.chat.models import RoomDefaults
from collab.chat.services import budgets


@admin.register(RoomDefaults)
class RoomDefaultsAdmin(AuditedAdmin):
    audit_as = "room_defaults"
    fields = ["budget_tokens", "budget_cost"]

    def label(self, obj: Any) -> str:
        return f"budget tokens {obj.budget_tokens}, cost {obj.budget_cost}"

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """One row, made on first visit."""
        RoomDefaults.objects.get_or_create(pk=1)
        return super().changelist_view(request, extra_context)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        budgets.forget_default()  # this process at once; the others within DEFAULTS_TTL_S
