"""Rooms, their members, bans and messages in the admin."""

from __future__ import annotations

from django.contrib import admin
from django.urls import URLPattern

from collab.chat.models import Ban, Membership, Message, Room


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    raw_id_fields = ["user"]


@admin.register(Room)
class RoomAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "owner", "status", "reply_to_all", "created_at", "last_seq"]
    search_fields = ["name", "slug"]
    filter_horizontal = ["assistants"]
    readonly_fields = ["last_seq", "invite_token", "status"]
    inlines = [MembershipInline]

    def get_urls(self) -> list[URLPattern]:
        from collab.chat.admin import live, usage

        return [*live.urls(self.admin_site), *usage.urls(self.admin_site), *super().get_urls()]


@admin.register(Ban)
class BanAdmin(admin.ModelAdmin):
    list_display = ["room", "user", "by", "reason", "created_at"]
    search_fields = ["room__slug", "user__username"]
    raw_id_fields = ["user", "by"]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ["room", "seq", "author_name", "role", "status", "tokens", "ttft_ms", "tps", "created_at"]
    list_filter = ["role", "status"]
    search_fields = ["text", "author_name"]
    raw_id_fields = ["author", "reply_to"]
    readonly_fields = ["room", "seq", "created_at", "finished_at"]
