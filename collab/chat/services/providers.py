"""Providers and what they cost: the default provider and those declared in the
environment (README "Providers from the environment"), a provider's configuration as
the model client sees it, prices, and the deployment-wide concurrency cap.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal

from django.conf import settings
from django.db.models import Sum

from collab.chat import shared
from collab.chat.models import Assistant, Message, Provider
from collab.chat.provider_env import default_endpoint_settings, env_providers, key_variable_allowed
from collab.llm.pool import ProviderConfig


def ensure_default_assistant() -> Assistant:
    """Providers follow the environment: "default" (docs/wire.md) and those in COLLAB_PROVIDERS,
    each with an assistant of the same handle. Returns the default assistant, which
    new rooms get."""
    provider, _ = Provider.objects.update_or_create(name="default", defaults=default_endpoint_settings())
    for name, values in env_providers().items():
        extra, _ = Provider.objects.update_or_create(name=name, defaults=values)
        Assistant.objects.get_or_create(handle=name, defaults={"display_name": name.title(), "provider": extra})
    assistant = Assistant.objects.filter(is_default=True).select_related("provider").first()
    if assistant is None:
        local = provider.base_url == settings.COLLAB_LOCAL_MODEL_URL
        assistant, _ = Assistant.objects.get_or_create(
            handle="assistant",
            defaults={
                "display_name": "Assistant",
                "provider": provider,
                "is_default": True,
                # a 135M model wanders at 0.7 ("Two + Two equals eight"); 0.2 keeps it on track
                "temperature": 0.2 if local else 0.7,
            },
        )
    return assistant


def provider_config(provider: Provider) -> ProviderConfig:
    return ProviderConfig(
        name=provider.name,
        base_urls=tuple(provider.base_urls),
        api_key_env=provider.api_key_env,
        connect_timeout_s=provider.connect_timeout_s,
        read_timeout_s=provider.read_timeout_s,
        total_timeout_s=provider.total_timeout_s,
        max_retries=provider.max_retries,
        max_concurrency=provider.max_concurrency,
        unhealthy_s=provider.unhealthy_s,
        deployment_max_concurrency=provider.deployment_max_concurrency,
        key_allowed=key_variable_allowed(provider.api_key_env),
    )


def room_cost(room_id: int) -> Decimal:
    """What the room's replies have cost so far, in US dollars."""
    total = Message.objects.filter(room_id=room_id).aggregate(total=Sum("cost"))["total"]
    return total or Decimal(0)


def user_cost(user_id: int) -> Decimal:
    """What the replies to a person's questions have cost, across rooms."""
    total = Message.objects.filter(reply_to__author_id=user_id).aggregate(total=Sum("cost"))["total"]
    return total or Decimal(0)


def prices(provider: Provider) -> tuple[Decimal, Decimal]:
    """US dollars per million input and output tokens."""
    return provider.price_input_per_m, provider.price_output_per_m


def reply_cost(price_per_m: tuple[Decimal, Decimal], prompt_tokens: int, completion_tokens: int) -> Decimal:
    return (price_per_m[0] * prompt_tokens + price_per_m[1] * completion_tokens) / Decimal(1_000_000)


class DeploymentSlots:
    """A provider's cap across every server process (`deployment_max_concurrency`),
    kept in the shared state; the tokens this process holds are renewed by its
    heartbeat (lifecycle.py), so a dead process's slots free themselves."""

    def __init__(self) -> None:
        self.held: set[tuple[str, str]] = set()

    async def acquire(self, name: str, cap: int, on_queued: Callable[[int], Awaitable[None]] | None) -> str:
        token = uuid.uuid4().hex
        await shared.backend().acquire_slot(name, cap, token, on_queued)
        self.held.add((name, token))
        return token

    async def release(self, name: str, token: str) -> None:
        self.held.discard((name, token))
        await shared.backend().release_slot(name, token)


deployment_slots = DeploymentSlots()
