"""MCP servers staff register for agents, the tools they list, and the audit of each call
(docs/architecture/agents.md, "MCP servers"). Part of collab.chat's models (re-exported by
models.py).

A server is reached over Streamable HTTP (under the egress policy, collab/chat/egress.py)
or, where the operator allows it (COLLAB_MCP_STDIO=1), as a child process over stdio.
Secrets are never stored: a header's or a child's environment value may name allowed tool
key variables as `${COLLAB_TOOL_KEY_...}`, filled in at call time.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator, URLValidator
from django.db import models

from collab.chat import egress

# `<server>__<tool>` must fit OpenAI's function names (^[a-zA-Z0-9_-]{1,64}$); a server's
# name has no "_", so the first "__" always ends it and no two servers' tools can clash.
OFFERED_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
SEPARATOR = "__"
server_name_validator = RegexValidator(
    r"^[a-zA-Z][a-zA-Z0-9-]{0,19}$", "1-20 letters, digits or '-', starting with a letter (no '_')."
)
# `${NAME}` in a header's or environment value: filled in from the environment at call time.
VARIABLE_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
HEADER_NAME_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_SCHEMA_CHARS = 20_000  # a schema beyond this is refused: it would crowd the model's context


def variables_in(values: dict[str, str]) -> list[str]:
    return [name for value in values.values() for name in VARIABLE_RE.findall(value)]


def _check_templates(values: Any, key_re: re.Pattern[str], what: str) -> str | None:
    """Why a mapping of header (or environment) names to `${VAR}` templates is refused, else None."""
    if not isinstance(values, dict):
        return f'A JSON object of {what}, e.g. {{"Authorization": "Bearer ${{COLLAB_TOOL_KEY_DOCS}}"}}.'
    for key, value in values.items():
        if not isinstance(value, str) or not key_re.match(key):
            return f"{key[:100]!r}: a {what[:-1]} name and a text value."
        if "$" in VARIABLE_RE.sub("", value):
            return f"{key}: write a variable as ${{NAME}}; a secret itself is never stored here."
    for name in variables_in(values):
        if error := egress.tool_key_variable_error(name):
            return error
    return None


def check_input_schema(schema: Any) -> str | None:
    """Why a tool's input schema cannot be offered to the model, else None (the tool is offered)."""
    from jsonschema import SchemaError, validators  # loaded when a listing is checked, not with the models

    if not isinstance(schema, dict):
        return "its input schema is not a JSON object"
    if schema.get("type") != "object":
        return f'its input schema is of type {str(schema.get("type"))[:40]!r}, not "object"'
    if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        return f"its input schema is longer than {MAX_SCHEMA_CHARS:,} characters"
    try:
        validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the top"
        return f"its input schema is not valid JSON Schema (at {where}: {exc.message[:200]})"
    return None


def offered_name(server: str, tool: str) -> str:
    """What the model calls a server's tool: `server__tool`, any character OpenAI's names refuse as '_'."""
    return f"{server}{SEPARATOR}{re.sub(r'[^a-zA-Z0-9_-]', '_', tool)}"


class McpServer(models.Model):
    """An MCP server whose tools agents may call. Off until enabled; its tools are listed on
    demand (the admin's action) and on a schedule (`manage.py refresh_mcp_tools`)."""

    class Transport(models.TextChoices):
        HTTP = "http", "Streamable HTTP"
        STDIO = "stdio", "stdio (a child process; only with COLLAB_MCP_STDIO=1)"

    name = models.CharField(
        max_length=20,
        unique=True,
        validators=[server_name_validator],
        help_text="Its tools are offered to the model as <name>__<tool>.",
    )
    transport = models.CharField(max_length=5, choices=Transport.choices, default=Transport.HTTP)
    url = models.URLField(
        max_length=500, blank=True, validators=[URLValidator(schemes=["http", "https"])], help_text="Streamable HTTP."
    )
    headers = models.JSONField(
        default=dict,
        blank=True,
        help_text='Streamable HTTP: headers sent, e.g. {"Authorization": "Bearer ${COLLAB_TOOL_KEY_DOCS}"}; '
        "${NAME} is read from the environment at each call (allowed: COLLAB_TOOL_KEY_* and the names in "
        "COLLAB_TOOL_KEY_VARIABLES).",
    )
    command = models.CharField(max_length=500, blank=True, help_text="stdio: the program to run.")
    args = models.JSONField(default=list, blank=True, help_text='stdio: its arguments, e.g. ["-m", "my_server"].')
    env = models.JSONField(
        "environment",
        default=dict,
        blank=True,
        help_text="stdio: variables set for the child (besides HOME, PATH and the like), values as for headers.",
    )
    timeout_s = models.FloatField(
        default=15.0,
        validators=[MinValueValidator(0.5), MaxValueValidator(120)],
        help_text="A call's (and a listing's) time, connecting included.",
    )
    enabled = models.BooleanField(default=False, help_text="Off: none of its tools is offered.")
    listed_at = models.DateTimeField(null=True, blank=True, help_text="When its tools were last listed.")
    list_error = models.CharField(max_length=500, blank=True, help_text="Why the last listing failed.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.transport == self.Transport.HTTP:
            if not self.url:
                errors["url"] = "A Streamable HTTP server needs its URL."
            elif error := egress.url_error(self.url):  # a literal address: checked again at each call
                errors["url"] = f"Refused: {error}."
            if error := _check_templates(self.headers, HEADER_NAME_RE, "headers"):
                errors["headers"] = error
        else:
            if not settings.COLLAB_MCP_STDIO:
                errors["transport"] = "stdio servers are off: the operator allows them with COLLAB_MCP_STDIO=1."
            if not self.command.strip():
                errors["command"] = "A stdio server needs its command."
            if not isinstance(self.args, list) or not all(isinstance(a, str) for a in self.args):
                errors["args"] = 'A JSON list of strings, e.g. ["-m", "my_server"].'
            if error := _check_templates(self.env, ENV_NAME_RE, "variables"):
                errors["env"] = error
        if errors:
            raise ValidationError(errors)


class McpTool(models.Model):
    """One tool a server listed, as it was listed (refreshed by the next listing). Offered to
    the assistants it is attached to (Assistant.mcp_tools) when its schema is valid and its
    server enabled."""

    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="tools")
    name = models.CharField(max_length=200, help_text="The server's name for it.")
    offered_as = models.CharField(max_length=64, help_text="The model's name for it: <server>__<tool>.")
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict)
    schema_error = models.CharField(
        max_length=300, blank=True, help_text="Why it is not offered (blank: it is offered where attached)."
    )
    listed_at = models.DateTimeField()

    class Meta:
        ordering = ["server__name", "name"]
        verbose_name = "MCP tool"
        constraints = [models.UniqueConstraint(fields=["server", "name"], name="one_mcp_tool_per_name")]

    def __str__(self) -> str:
        return self.offered_as


class McpCall(models.Model):
    """One call of an MCP tool by an agent: who asked, in which room, which server and tool,
    how long, how it ended. Never its arguments (they may carry what a room holds)."""

    class Outcome(models.TextChoices):
        OK = "ok"
        ERROR = "error", "the tool answered an error"
        FAILED = "failed", "the server failed or could not be reached"
        REFUSED = "refused", "refused (egress policy, stdio off, a key variable)"
        TIMEOUT = "timeout"
        STOPPED = "stopped", "stopped with its run"

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    asker = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    asker_name = models.CharField(max_length=150, blank=True)
    room = models.ForeignKey("chat.Room", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    room_name = models.CharField(max_length=120, blank=True)
    reply = models.ForeignKey("chat.Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    server = models.ForeignKey(McpServer, null=True, blank=True, on_delete=models.SET_NULL, related_name="calls")
    server_name = models.CharField(max_length=20)
    tool_name = models.CharField(max_length=200)
    duration_ms = models.PositiveIntegerField()
    outcome = models.CharField(max_length=8, choices=Outcome.choices, db_index=True)
    detail = models.CharField(max_length=500, blank=True, help_text="The error shown to the model and the room.")

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name = "MCP call"

    def __str__(self) -> str:
        return f"{self.server_name}{SEPARATOR}{self.tool_name} {self.outcome}"
