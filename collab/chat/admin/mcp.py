"""MCP servers, their tools and the audit of their calls in the admin (docs/architecture/agents.md,
"MCP servers"). A server's add, change and delete is audited like an HTTP tool's (it decides
where agents send what rooms hold); its tools are listed by an action and on a schedule,
shown as listed (schemas read-only), and attached to assistants here or on the assistant.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.utils.safestring import SafeString

from collab.chat.admin.audit import ReadOnlyAdmin
from collab.chat.admin.providers import AuditedAdmin
from collab.chat.models import McpCall, McpServer, McpTool
from collab.chat.services import mcp_catalog


class McpToolInline(admin.TabularInline):  # type: ignore[type-arg]
    model = McpTool
    extra = 0
    can_delete = False
    fields = ("offered_as", "description", "schema_error", "listed_at")
    readonly_fields = fields
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the server's listing adds them


@admin.register(McpServer)
class McpServerAdmin(AuditedAdmin):
    list_display = ["name", "transport", "url", "command", "enabled", "timeout_s", "tool_count", "listed_at"]
    list_display += ["list_error"]
    list_filter = ["enabled", "transport"]
    search_fields = ["name", "url", "command"]
    readonly_fields = ["listed_at", "list_error", "created_at", "updated_at"]
    fieldsets = [
        (None, {"fields": ["name", "transport", "enabled", "timeout_s"]}),
        ("Streamable HTTP", {"fields": ["url", "headers"]}),
        ("stdio (only with COLLAB_MCP_STDIO=1)", {"fields": ["command", "args", "env"]}),
        ("Its tools", {"fields": ["listed_at", "list_error", "created_at", "updated_at"]}),
    ]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    inlines = [McpToolInline]
    actions = ["list_tools"]
    audit_as = "mcp_server"

    def get_queryset(self, request: HttpRequest) -> QuerySet[McpServer]:
        return super().get_queryset(request).prefetch_related("tools")

    @admin.display(description="tools")
    def tool_count(self, obj: McpServer) -> int:
        return len(obj.tools.all())

    @admin.action(description="List the selected servers' tools now")
    def list_tools(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset[:10]:
            listing = mcp_catalog.refresh(server)
            self.message_user(request, str(listing), messages.ERROR if listing.error else messages.INFO)


@admin.register(McpTool)
class McpToolAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """As the server listed it, read-only: staff attach it to assistants on the assistant's page
    (its "MCP tools"), as HTTP tools."""

    list_display = ["offered_as", "server", "offered", "schema_error", "used_by", "listed_at"]
    list_filter = ["server", "assistants"]
    search_fields = ["name", "offered_as", "description"]
    fields = ("server", "name", "offered_as", "description", "schema", "schema_error", "listed_at", "used_by")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[McpTool]:
        return super().get_queryset(request).select_related("server").prefetch_related("assistants")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the next listing would overwrite any change

    @admin.display(boolean=True, description="offered")
    def offered(self, obj: McpTool) -> bool:
        return not obj.schema_error and obj.server.enabled

    @admin.display(description="used by")
    def used_by(self, obj: McpTool) -> str:
        return ", ".join(f"@{a.handle}" for a in obj.assistants.all()) or "-"

    @admin.display(description="input schema")
    def schema(self, obj: McpTool) -> SafeString:
        text = json.dumps(obj.input_schema, indent=2, ensure_ascii=False)
        return SafeString(render_to_string("admin/chat/mcp_schema.html", {"schema": text}))


@admin.register(McpCall)
class McpCallAdmin(ReadOnlyAdmin):
    list_display = ["at", "asker_name", "room_name", "server_name", "tool_name", "duration_ms", "outcome", "detail"]
    list_filter = ["outcome", "server_name", "at"]
    search_fields = ["asker_name", "room_name", "server_name", "tool_name", "detail"]
    date_hierarchy = "at"
