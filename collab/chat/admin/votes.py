"""Votes on assistants' replies in the admin: a read-only record, per room (services/votes.py).

Staff read who voted what on which reply, and when; nobody adds, edits or deletes a
vote here (a member's vote is theirs: they change it in the room)."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from collab.chat.admin.audit import ReadOnlyAdmin
from collab.chat.models import Vote


@admin.register(Vote)
class VoteAdmin(ReadOnlyAdmin):
    list_display = ["room", "reply", "voter_name", "value", "at"]
    list_filter = ["message__room", "value", "at"]
    search_fields = ["voter_name", "message__room__name", "message__room__slug"]
    list_select_related = ["message__room"]
    ordering = ["-at", "-id"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Vote]:
        return super().get_queryset(request).select_related("message__room")

    @admin.display(description="room", ordering="message__room__name")
    def room(self, obj: Vote) -> str:
        return obj.message.room.name

    @admin.display(description="reply")
    def reply(self, obj: Vote) -> str:
        return f"#{obj.message.seq} {obj.message.author_name}"
