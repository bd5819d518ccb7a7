"""OpenID Connect providers from the environment (collab/oidc_settings.py; README
"Signing in through your identity provider"): a complete block becomes django-allauth's
settings-based app, with the secret's variable name and never its value; each missing or
malformed variable is named in the error. COLLAB_PASSWORD_LOGIN=0 with no provider: the
settings refuse to load (nobody could sign in)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from collab.oidc_settings import providers_from_env
from tests.test_settings import production_env, run

KEYCLOAK = {
    "COLLAB_OIDC_PROVIDERS": "corp, google",
    "COLLAB_OIDC_CORP_ISSUER": "https://kc.example.com/realms/acme/",
    "COLLAB_OIDC_CORP_CLIENT_ID": "collab",
    "COLLAB_OIDC_CORP_SECRET_VARIABLE": "COLLAB_OIDC_CORP_SECRET",
    "COLLAB_OIDC_CORP_SECRET": "s3cret-value",
    "COLLAB_OIDC_CORP_LABEL": "Acme SSO",
    "COLLAB_OIDC_CORP_SCOPES": "openid,profile email groups",
    "COLLAB_OIDC_CORP_ALLOWED_GROUPS": "collab users,/collab-admins",
    "COLLAB_OIDC_CORP_STAFF_GROUPS": "/collab-admins",
    "COLLAB_OIDC_GOOGLE_ISSUER": "https://accounts.google.com",
    "COLLAB_OIDC_GOOGLE_CLIENT_ID": "123.apps.googleusercontent.com",
    "COLLAB_OIDC_GOOGLE_SECRET_VARIABLE": "GOOGLE_SECRET",
}


def test_each_provider_becomes_an_app_with_its_secrets_name_only() -> None:
    corp, google = providers_from_env(KEYCLOAK)
    assert corp["provider_id"] == "corp" and corp["name"] == "Acme SSO" and corp["client_id"] == "collab"
    assert corp["secret"] == "" and "s3cret-value" not in repr(corp)
    assert corp["settings"]["server_url"] == "https://kc.example.com/realms/acme"
    assert corp["settings"]["secret_variable"] == "COLLAB_OIDC_CORP_SECRET"
    assert corp["settings"]["scope"] == ["openid", "profile", "email", "groups"]
    assert corp["settings"]["oauth_pkce_enabled"] is True
    assert corp["settings"]["allowed_groups"] == ["collab users", "/collab-admins"]
    assert corp["settings"]["staff_groups"] == ["/collab-admins"]
    assert google["name"] == "google" and google["settings"]["scope"] == ["openid", "profile", "email"]
    assert google["settings"]["groups_claim"] == "groups" and google["settings"]["allowed_groups"] == []
    assert providers_from_env({}) == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"COLLAB_OIDC_CORP_CLIENT_ID": ""}, "COLLAB_OIDC_CORP_CLIENT_ID is not set"),
        ({"COLLAB_OIDC_CORP_ISSUER": "http://kc.example.com/realms/acme"}, "write an https:// URL"),
        ({"COLLAB_OIDC_CORP_SECRET_VARIABLE": "s3cret-value"}, "write the NAME of the variable"),
        ({"COLLAB_OIDC_CORP_SCOPES": "profile email"}, "SCOPES must include openid"),
        ({"COLLAB_OIDC_PROVIDERS": "corp,9lives"}, "'9lives' is not an id"),
    ],
)
def test_a_missing_or_malformed_variable_is_named(change: dict[str, str], named: str) -> None:
    with pytest.raises(ImproperlyConfigured) as error:
        providers_from_env({**KEYCLOAK, **change})
    assert named in str(error.value)


def test_http_is_allowed_on_loopback_only() -> None:
    env = {**KEYCLOAK, "COLLAB_OIDC_PROVIDERS": "corp", "COLLAB_OIDC_CORP_ISSUER": "http://127.0.0.1:8080/realms/x"}
    assert providers_from_env(env)[0]["settings"]["server_url"] == "http://127.0.0.1:8080/realms/x"


def test_passwords_off_without_a_provider_refuses_to_start(tmp_path: Path) -> None:
    env = production_env(tmp_path, DJANGO_SECRET_KEY="k" * 60, COLLAB_PASSWORD_LOGIN="0")
    done = run([sys.executable, "manage.py", "check"], env)
    assert done.returncode != 0
    assert "COLLAB_PASSWORD_LOGIN=0 needs at least one provider in COLLAB_OIDC_PROVIDERS" in done.stderr
    env.update({k: v for k, v in KEYCLOAK.items() if "GOOGLE" not in k}, COLLAB_OIDC_PROVIDERS="corp")
    assert run([sys.executable, "manage.py", "check"], env).returncode == 0
