"""Providers and assistants in the admin. A change to a provider is audited (who, what, from where)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db import models, transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from collab.chat.management.commands.benchmark_provider import run_benchmark
from collab.chat.models import Assistant, Provider
from collab.chat.services import moderation


def staff_actor(request: HttpRequest) -> moderation.Actor:
    """The staff member acting through the admin, and the address the request came from."""
    assert request.user.is_authenticated
    return moderation.Actor(request.user, request.META.get("REMOTE_ADDR") or None)  # type: ignore[arg-type]


class AuditedAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Each add, change and delete leaves one audit row, "<audit_as>.change" / ".delete",
    naming the objects by `label` (providers, assistants, agents' tools: they decide where
    rooms are sent and billed)."""

    audit_as = ""

    def label(self, obj: Any) -> str:
        return str(obj.name)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            if change and not form.changed_data:
                return  # saved as it was: nothing to record
            fields = ", ".join(form.changed_data) if change else "created"
            detail = f"{self.label(obj)}: {fields}"[:500]
            moderation.record(staff_actor(request), f"{self.audit_as}.change", detail=detail)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        self.delete_queryset(request, type(obj).objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        with transaction.atomic():
            names = ", ".join(self.label(obj) for obj in queryset)
            super().delete_queryset(request, queryset)
            moderation.record(staff_actor(request), f"{self.audit_as}.delete", detail=names[:500])


@admin.register(Provider)
class ProviderAdmin(AuditedAdmin):
    list_display = ["name", "base_url", "api_key_env", "default_model", "max_concurrency", "price_output_per_m"]
    search_fields = ["name", "base_url"]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    actions = ["benchmark"]
    audit_as = "provider"

    @admin.action(description="Benchmark the selected providers (1 run of each prompt)")
    def benchmark(self, request: HttpRequest, queryset: QuerySet[Provider]) -> None:
        for provider in queryset[:5]:
            result = run_benchmark(provider, runs=1)
            level = messages.ERROR if all(not s["runs"] for s in result["scenarios"].values()) else messages.INFO
            self.message_user(request, format_html("<b>{}</b><pre>{}</pre>", provider.name, result["table"]), level)


@admin.register(Assistant)
class AssistantAdmin(AuditedAdmin):
    list_display = ["handle", "display_name", "provider", "model", "temperature", "max_tokens", "is_default"]
    list_display += ["is_agent", "available_to"]
    list_filter = ["provider", "is_default", "is_agent", "available_to"]
    search_fields = ["handle", "display_name"]
    # is_agent, agent_steps, agent_tokens and tools: in the form as model fields; who may use
    # it (services/availability.py): available_to, and the rooms and groups granted it.
    filter_horizontal = ["tools", "mcp_tools", "granted_rooms", "granted_groups"]

    audit_as = "assistant"  # its provider, model and prompt decide what rooms are sent and billed

    def label(self, obj: Assistant) -> str:
        return f"@{obj.handle}"
