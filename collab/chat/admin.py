from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from collab.chat.models import Assistant, Membership, Message, Provider, Room


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):
    list_display = ["name", "base_url", "api_key_env", "default_model", "max_concurrency", "price_output_per_m"]
    search_fields = ["name", "base_url"]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    actions = ["benchmark"]

    @admin.action(description="Benchmark the selected providers (1 run of each prompt)")
    def benchmark(self, request: HttpRequest, queryset: QuerySet[Provider]) -> None:
        from collab.chat.management.commands.benchmark_provider import run_benchmark

        for provider in queryset[:5]:
            result = run_benchmark(provider, runs=1)
            level = messages.ERROR if all(not s["runs"] for s in result["scenarios"].values()) else messages.INFO
            self.message_user(request, format_html("<b>{}</b><pre>{}</pre>", provider.name, result["table"]), level)


@admin.register(Assistant)
class AssistantAdmin(admin.ModelAdmin):
    list_display = ["handle", "display_name", "provider", "model", "temperature", "max_tokens", "is_default"]
    list_filter = ["provider", "is_default"]
    search_fields = ["handle", "display_name"]


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    raw_id_fields = ["user"]


@admin.register(Room)
class RoomAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "owner", "reply_to_all", "created_at", "last_seq"]
    search_fields = ["name", "slug"]
    filter_horizontal = ["assistants"]
    readonly_fields = ["last_seq", "invite_token"]
    inlines = [MembershipInline]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ["room", "seq", "author_name", "role", "status", "tokens", "ttft_ms", "tps", "created_at"]
    list_filter = ["role", "status"]
    search_fields = ["text", "author_name"]
    raw_id_fields = ["author", "reply_to"]
    readonly_fields = ["room", "seq", "created_at", "finished_at"]
