"""OpenID Connect providers from the environment (README "Signing in through your identity
provider"; docs/architecture/sign-in.md): read by collab/settings.py into django-allauth's
settings-based APPS, so that no provider, and no secret, is ever a database row.

    COLLAB_OIDC_PROVIDERS=corp            # ids, comma-separated: one block of variables each
    COLLAB_OIDC_CORP_ISSUER=https://kc.example.com/realms/acme
    COLLAB_OIDC_CORP_CLIENT_ID=collab
    COLLAB_OIDC_CORP_SECRET_VARIABLE=COLLAB_OIDC_CORP_SECRET   # the NAME; its value is read at use
    COLLAB_OIDC_CORP_SCOPES=openid profile email groups      # default: openid profile email
    COLLAB_OIDC_CORP_LABEL=Acme SSO                          # the button's text
    COLLAB_OIDC_CORP_ALLOWED_GROUPS=collab-users             # optional: only these may sign in
    COLLAB_OIDC_CORP_STAFF_GROUPS=collab-admins              # optional: these are staff
    COLLAB_OIDC_CORP_GROUPS_CLAIM=groups                     # default: groups
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

_ID = re.compile(r"^[a-z][a-z0-9-]{0,39}$")


def _split(raw: str, separators: str = ",") -> list[str]:
    """Group names may hold spaces: they are split on commas only; ids and scopes on both."""
    return [part.strip() for part in re.split(f"[{separators}]", raw) if part.strip()]


def providers_from_env(environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """One django-allauth APPS entry per id in COLLAB_OIDC_PROVIDERS; every missing or
    malformed variable is named in the error, so a server never starts half-configured."""
    apps: list[dict[str, Any]] = []
    for provider_id in [p.lower() for p in _split(environ.get("COLLAB_OIDC_PROVIDERS", ""), ", ")]:
        if not _ID.match(provider_id):
            raise ImproperlyConfigured(
                f"COLLAB_OIDC_PROVIDERS: {provider_id!r} is not an id (a letter, then letters, digits or -)."
            )
        prefix = f"COLLAB_OIDC_{provider_id.upper().replace('-', '_')}_"

        def get(name: str, default: str | None = None, *, prefix: str = prefix) -> str:
            value = environ.get(prefix + name, "").strip()
            if value:
                return value
            if default is None:
                raise ImproperlyConfigured(f"{prefix}{name} is not set (README: Signing in through your provider).")
            return default

        issuer = get("ISSUER").rstrip("/")
        parts = urlsplit(issuer)
        local = parts.hostname in ("127.0.0.1", "localhost", "::1")
        if parts.scheme != "https" and not (parts.scheme == "http" and local):
            raise ImproperlyConfigured(f"{prefix}ISSUER={issuer!r}: write an https:// URL (http only on loopback).")
        secret_variable = get("SECRET_VARIABLE")
        if not re.match(r"^[A-Z_][A-Z0-9_]*$", secret_variable):
            raise ImproperlyConfigured(
                f"{prefix}SECRET_VARIABLE={secret_variable!r}: write the NAME of the variable holding the secret."
            )
        scopes = _split(get("SCOPES", "openid profile email"), ", ")
        if "openid" not in scopes:
            raise ImproperlyConfigured(f"{prefix}SCOPES must include openid.")
        apps.append(
            {
                "provider_id": provider_id,
                "name": get("LABEL", provider_id),
                "client_id": get("CLIENT_ID"),
                # Never the secret itself: collab/signin/oidc.py reads the variable at use.
                "secret": "",
                "settings": {
                    "server_url": issuer,
                    "scope": scopes,
                    "oauth_pkce_enabled": True,
                    "secret_variable": secret_variable,
                    "allowed_groups": _split(get("ALLOWED_GROUPS", "")),
                    "staff_groups": _split(get("STAFF_GROUPS", "")),
                    "groups_claim": get("GROUPS_CLAIM", "groups"),
                },
            }
        )
    return apps
