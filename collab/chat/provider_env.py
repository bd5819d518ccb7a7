"""Providers from the environment (README "Providers from the environment") and the
environment variables a provider may take its key from (a tool's: collab/chat/egress.py).
Reads the environment and the settings only: models validate with it, services configure
with it.
"""

from __future__ import annotations

import contextlib
import os
import re
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from collab.llm.local import MODEL_LABEL, MODEL_NAME


def _split_urls(value: str) -> tuple[str, str]:
    """ "url1,url2,..." -> (first, the rest one per line): an endpoint pool."""
    urls = [u.strip() for u in value.split(",") if u.strip()]
    return (urls[0] if urls else ""), "\n".join(urls[1:])


def default_endpoint_settings() -> dict[str, Any]:
    """The default provider as docs/wire.md configures it: COLLAB_LLM_* first, then
    OPENAI_API_KEY alone for the OpenAI API, else the embedded local model."""
    if settings.COLLAB_LLM_BASE_URL:
        base_url, extra = _split_urls(settings.COLLAB_LLM_BASE_URL)
        return {
            "base_url": base_url,
            "extra_base_urls": extra,
            "api_key_env": settings.COLLAB_LLM_API_KEY_ENV if os.environ.get("COLLAB_LLM_API_KEY") else "",
            "default_model": settings.COLLAB_LLM_MODEL or "default",
            "context_chars": 0,
        }
    if os.environ.get("OPENAI_API_KEY"):
        return {
            "base_url": "https://api.openai.com/v1",
            "extra_base_urls": "",
            "api_key_env": "OPENAI_API_KEY",
            "default_model": settings.COLLAB_LLM_MODEL or "gpt-4o-mini",
            "context_chars": 0,
        }
    return {
        "base_url": settings.COLLAB_LOCAL_MODEL_URL,
        "extra_base_urls": "",
        "api_key_env": "",
        "default_model": settings.COLLAB_LLM_MODEL or MODEL_NAME,
        # SmolLM2 on 2 cores reads ~100-400 prompt tokens/s: ~750 tokens of history
        # keep its first token within seconds (12,000 characters took 22-28 s).
        "context_chars": 3000,
    }


def is_embedded_model(model: str) -> bool:
    """Whether `model` (an assistant's model, or the one a reply was written by) is the
    embedded local model (`make run` with no endpoint configured: README "Set up"). Its
    name says so, whoever serves it; `serve --model simulated` names its model apart."""
    return model == MODEL_NAME


def model_label(model: str) -> str:
    """What a page shows of `model`: its name, or for the embedded model what it is."""
    return MODEL_LABEL if is_embedded_model(model) else model


_ENV_NUMBERS = {
    "CONNECT_TIMEOUT": "connect_timeout_s",
    "READ_TIMEOUT": "read_timeout_s",
    "TOTAL_TIMEOUT": "total_timeout_s",
    "MAX_RETRIES": "max_retries",
    "MAX_CONCURRENCY": "max_concurrency",
    "DEPLOYMENT_MAX_CONCURRENCY": "deployment_max_concurrency",
    "UNHEALTHY_S": "unhealthy_s",
    "PRICE_INPUT": "price_input_per_m",
    "PRICE_OUTPUT": "price_output_per_m",
}


def env_providers() -> dict[str, dict[str, Any]]:
    """Providers named in COLLAB_PROVIDERS, each from COLLAB_PROVIDER_<NAME>_* variables
    (README "Providers from the environment"). Raises ImproperlyConfigured when one is
    incomplete or malformed, naming the variable."""
    out: dict[str, dict[str, Any]] = {}
    for raw in os.environ.get("COLLAB_PROVIDERS", "").split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,63}", name) or name == "default":
            raise ImproperlyConfigured(f"COLLAB_PROVIDERS: {name!r} is not a valid provider name")
        prefix = f"COLLAB_PROVIDER_{name.upper().replace('-', '_')}_"
        base_url, extra = _split_urls(os.environ.get(prefix + "BASE_URL", ""))
        model = os.environ.get(prefix + "MODEL", "")
        if not base_url or not model:
            raise ImproperlyConfigured(f"{prefix}BASE_URL and {prefix}MODEL are required")
        values: dict[str, Any] = {
            "base_url": base_url,
            "extra_base_urls": extra,
            "default_model": model,
            "api_key_env": os.environ.get(prefix + "API_KEY_ENV", f"{name.upper().replace('-', '_')}_API_KEY"),
        }
        for suffix, fieldname in _ENV_NUMBERS.items():
            value = os.environ.get(prefix + suffix)
            if value:
                try:
                    values[fieldname] = Decimal(value) if fieldname.startswith("price") else float(value)
                except (ValueError, ArithmeticError):
                    raise ImproperlyConfigured(f"{prefix}{suffix} must be a number, not {value!r}") from None
        out[name] = values
    return out


KEY_PREFIX = "COLLAB_KEY_"


def allowed_key_variables() -> set[str]:
    """The variables a provider may take its key from, besides any named COLLAB_KEY_*: the
    ones collab names itself, those listed in COLLAB_KEY_VARIABLES, and the key variables
    of the providers declared in the environment. An operator allows a name; staff
    editing a provider cannot point it at another secret of the process."""
    names = {"COLLAB_LLM_API_KEY", "OPENAI_API_KEY"}
    names |= {n.strip() for n in os.environ.get("COLLAB_KEY_VARIABLES", "").split(",") if n.strip()}
    with contextlib.suppress(ImproperlyConfigured):  # reported where the providers are created
        names |= {v["api_key_env"] for v in env_providers().values() if v["api_key_env"]}
    return names


def key_variable_allowed(name: str) -> bool:
    if not name:
        return True
    if name.startswith("DJANGO_"):  # Django's own secrets, whatever the list says
        return False
    return name.startswith(KEY_PREFIX) or name in allowed_key_variables()
