"""Assistants: who answers an @mention, with which provider, model, prompt and tools, and
in which rooms (services/availability.py). Part of collab.chat's models (re-exported by
models.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from collab.chat import provider_env
from collab.chat.mcp_models import McpTool
from collab.chat.provider_models import Provider, Tool, handle_validator

if TYPE_CHECKING:
    from collab.chat.models import Room


class Assistant(models.Model):
    handle = models.CharField(max_length=32, unique=True, validators=[handle_validator])
    display_name = models.CharField(max_length=100)
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="assistants")
    model = models.CharField(max_length=200, blank=True, help_text="Blank: the provider's default model.")
    system_prompt = models.TextField(blank=True, default="You are a helpful assistant in a team chat room.")
    temperature = models.FloatField(default=0.7, validators=[MinValueValidator(0), MaxValueValidator(2)])
    max_tokens = models.PositiveIntegerField(default=1024, validators=[MinValueValidator(1)])
    is_default = models.BooleanField(default=False, help_text="Attached to every new room.")
    is_agent = models.BooleanField(
        "agent", default=False, help_text="Plans, calls tools, checks its steps and re-plans (within the budgets)."
    )
    agent_steps = models.PositiveSmallIntegerField(
        default=8,
        validators=[MinValueValidator(3), MaxValueValidator(50)],
        help_text="Model calls per run (at least 3: a plan, a step, an answer).",
    )
    agent_tokens = models.PositiveIntegerField(
        default=20000, validators=[MinValueValidator(100)], help_text="Completion tokens per run."
    )
    tools = models.ManyToManyField(
        Tool, blank=True, related_name="assistants", help_text="HTTP tools it may call (the built-ins: always)."
    )
    mcp_tools = models.ManyToManyField(
        McpTool,
        blank=True,
        related_name="assistants",
        verbose_name="MCP tools",
        help_text="MCP servers' tools it may call (offered while the server is enabled and the schema valid).",
    )

    # Images go to it as image parts; one that cannot see them gets a note that says so
    # (chat/files/for_models.py). The embedded local model never sees them.
    vision = models.BooleanField(
        "sees images", default=True, help_text="Its model reads images (else it is told an image was attached)."
    )

    class Availability(models.TextChoices):
        EVERYONE = "everyone", "every room"
        GRANTED = "granted", "only the rooms granted below (by room, or by the owner's group)"

    # Who may use it (services/availability.py; README "Security"): set by staff. New
    # assistants are granted-only: one with HTTP tools or a provider's key reaches no
    # self-made room until staff say so.
    available_to = models.CharField(
        "available to",
        max_length=10,
        choices=Availability.choices,
        default=Availability.GRANTED,
        help_text="Rooms whose owner may attach it (and in which it replies).",
    )
    granted_rooms: models.ManyToManyField[Room, Any] = models.ManyToManyField(
        "Room", blank=True, related_name="granted_assistants", help_text="Granted-only: these rooms may use it."
    )
    granted_groups = models.ManyToManyField(
        "auth.Group",
        blank=True,
        related_name="granted_assistants",
        help_text="Granted-only: rooms owned by a member of these groups may use it.",
    )

    class Meta:
        ordering = ["handle"]

    def __str__(self) -> str:
        return f"@{self.handle}"

    def clean(self) -> None:
        if self.is_default and self.available_to != self.Availability.EVERYONE:
            raise ValidationError(
                {"available_to": "A default assistant is attached to every new room: make it available to every room."}
            )

    @property
    def model_name(self) -> str:
        return self.model or self.provider.default_model

    @property
    def model_label(self) -> str:
        """Its model as pages show it: the name, or what the embedded local model is
        (provider_env.model_label; a template: `{{ message.model|model_label }}`)."""
        return provider_env.model_label(self.model_name)

    @property
    def is_embedded_model(self) -> bool:
        return provider_env.is_embedded_model(self.model_name)
