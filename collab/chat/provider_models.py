"""What assistants call: the providers (OpenAI-compatible endpoints) and the HTTP tools
staff register for agents, with their validators. Part of collab.chat's models
(re-exported by models.py)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator, URLValidator
from django.db import models

from collab.chat import egress
from collab.chat.provider_env import key_variable_allowed

HANDLE_RE = r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}"
handle_validator = RegexValidator(
    rf"^{HANDLE_RE}$", "A handle is 1-32 letters, digits, '-' or '_', starting with a letter or digit."
)
env_name_validator = RegexValidator(
    r"^[A-Z_][A-Z0-9_]{0,127}$", "The name of an environment variable, e.g. OPENAI_API_KEY."
)


# The agents' built-in tools (collab/chat/replies/tools.py checks its list against this one):
# a tool staff register may not take one of their names.
BUILTIN_TOOL_NAMES = frozenset(
    {"search_room", "read_message", "read_file", "search_files", "calculate", "room_members", "current_time"}
)

tool_name_validator = RegexValidator(
    r"^[a-zA-Z][a-zA-Z0-9_]{0,63}$", "Like a function name: a letter, then up to 63 letters, digits or '_'."
)


def key_variable_error(name: str) -> str | None:
    if key_variable_allowed(name):
        return None
    return (
        f"{name} is not an allowed key variable: name it COLLAB_KEY_..., or have the operator list it in "
        "COLLAB_KEY_VARIABLES."
    )


class Provider(models.Model):
    """An OpenAI-compatible endpoint. Its key is read from the environment variable named
    here at call time; the key itself is never stored."""

    name = models.SlugField(max_length=64, unique=True)
    base_url = models.URLField(max_length=500)
    api_key_env = models.CharField(
        "API key environment variable",
        max_length=128,
        blank=True,
        validators=[env_name_validator],
        help_text="Name of the environment variable that holds the key (blank: no key). Allowed: names "
        "starting with COLLAB_KEY_, those the operator lists in COLLAB_KEY_VARIABLES, OPENAI_API_KEY, "
        "COLLAB_LLM_API_KEY and the key variables of providers declared in the environment; never DJANGO_*.",
    )
    default_model = models.CharField(max_length=200)
    connect_timeout_s = models.FloatField(default=5.0, validators=[MinValueValidator(0.1)])
    read_timeout_s = models.FloatField(
        default=30.0, validators=[MinValueValidator(0.1)], help_text="Longest silence between two chunks."
    )
    total_timeout_s = models.FloatField(default=300.0, validators=[MinValueValidator(1)])
    max_retries = models.PositiveSmallIntegerField(
        default=2, help_text="Retries before the first byte (429 and 5xx, honouring Retry-After)."
    )
    extra_base_urls = models.TextField(
        blank=True,
        help_text="More endpoints of the same pool, one URL per line. Each request goes to the healthy "
        "endpoint with the fewest streams in flight.",
    )
    unhealthy_s = models.FloatField(
        default=30.0,
        validators=[MinValueValidator(0)],
        help_text="How long an endpoint that failed before its first token is avoided.",
    )

    class ImageDelivery(models.TextChoices):
        DATA = "data", "in the request (base64 data URLs)"
        URL = "url", "as signed links to this server (COLLAB_PUBLIC_URL must reach it)"

    image_delivery = models.CharField(
        "images sent",
        max_length=4,
        choices=ImageDelivery.choices,
        default=ImageDelivery.DATA,
        help_text="How images attached in a room reach this provider's vision models.",
    )
    max_concurrency = models.PositiveIntegerField(
        default=0,
        help_text="Streams at once per server process (0: no cap). Requests beyond it queue, in order.",
    )
    deployment_max_concurrency = models.PositiveIntegerField(
        default=0,
        help_text="Streams at once across every server process of the deployment (0: no cap). Requests "
        "beyond it queue, first come first served, whichever process they arrive on (kept in Redis).",
    )
    context_chars = models.PositiveIntegerField(
        default=0,
        help_text="Room history sent to the model, in characters (0: COLLAB_CONTEXT_CHARS). Small local "
        "models read prompts slowly: a smaller window keeps their first token quick.",
    )
    price_input_per_m = models.DecimalField(
        "price per 1M input tokens", max_digits=10, decimal_places=4, default=Decimal(0)
    )
    price_output_per_m = models.DecimalField(
        "price per 1M output tokens", max_digits=10, decimal_places=4, default=Decimal(0)
    )

    def __str__(self) -> str:
        return self.name

    @property
    def base_urls(self) -> list[str]:
        extra = [u.strip() for u in self.extra_base_urls.splitlines() if u.strip()]
        return [self.base_url, *[u for u in extra if u != self.base_url]]

    def clean(self) -> None:
        if error := key_variable_error(self.api_key_env):
            raise ValidationError({"api_key_env": error})
        for url in self.extra_base_urls.splitlines():
            if url.strip():
                try:
                    URLValidator(schemes=["http", "https"])(url.strip())
                except ValidationError:
                    raise ValidationError({"extra_base_urls": f"Not a URL: {url.strip()[:100]}"}) from None


def object_schema() -> dict[str, Any]:
    return {"type": "object", "properties": {}}


def check_object_schema(value: Any) -> None:
    if not isinstance(value, dict) or value.get("type") != "object":
        raise ValidationError('A JSON schema of an object: {"type": "object", "properties": {...}}.')


class Tool(models.Model):
    """An HTTP tool for agents, registered by staff: the call's arguments are POSTed as JSON to
    `url`, the response text is the result (untrusted). Off by default, enabled per assistant."""

    name = models.CharField(max_length=64, unique=True, validators=[tool_name_validator])
    description = models.TextField(max_length=1000, help_text="What the model is told the tool does.")
    url = models.URLField(max_length=500, validators=[URLValidator(schemes=["http", "https"])])
    parameters = models.JSONField(
        default=object_schema, validators=[check_object_schema], help_text="The arguments, as a JSON schema object."
    )
    timeout_s = models.FloatField(default=10.0, validators=[MinValueValidator(0.1), MaxValueValidator(120)])
    api_key_env = models.CharField(
        "API key environment variable",
        max_length=128,
        blank=True,
        validators=[env_name_validator],
        help_text="Sent as 'Authorization: Bearer <value>' (blank: none). Allowed: names starting with "
        "COLLAB_TOOL_KEY_, and those the operator lists in COLLAB_TOOL_KEY_VARIABLES; never a provider's key.",
    )
    enabled = models.BooleanField(default=False, help_text="Off by default; agents get it only when attached.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors = {"name": f"{self.name} is a built-in tool's name."} if self.name in BUILTIN_TOOL_NAMES else {}
        if error := egress.tool_key_variable_error(self.api_key_env):
            errors["api_key_env"] = error
        if self.url and (error := egress.url_error(self.url)):  # a literal address: checked again at each call
            errors["url"] = f"Refused: {error}."
        if errors:
            raise ValidationError(errors)
