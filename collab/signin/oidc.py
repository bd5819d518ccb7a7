"""django-allauth's OpenID Connect provider, with the checks it leaves out
(docs/architecture/sign-in.md#what-collab-adds-to-allauth):

- a nonce sent with every authorization request and required back in the ID token;
- the ID token's signature always verified against the provider's JWKS (allauth skips it
  when the token came straight from the token endpoint, as OIDC Core 3.1.3.7 allows);
- exp, iat and nbf checked with a bounded leeway (COLLAB_OIDC_CLOCK_SKEW_S), iat required;
- the discovery document's issuer equal to the configured one;
- the client secret read from its environment variable at use, never stored.

Each failure is a SignInRefused whose message the error page shows as it is.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

import jwt
import requests
from allauth.socialaccount.helpers import render_authentication_error
from allauth.socialaccount.internal import jwtkit
from allauth.socialaccount.providers.oauth2.client import OAuth2Client, OAuth2Error
from allauth.socialaccount.providers.oauth2.views import OAuth2CallbackView, OAuth2LoginView
from allauth.socialaccount.providers.openid_connect.provider import OpenIDConnectProvider
from allauth.socialaccount.providers.openid_connect.views import OpenIDConnectOAuth2Adapter
from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_http_methods


class SignInRefused(OAuth2Error):
    """A refusal whose message is written for the person signing in (the error page shows it)."""

    is_for_people = True


def _secret(app: Any) -> str:
    name = app.settings.get("secret_variable", "")
    value = os.environ.get(name, "") if name else ""
    if not value:
        raise SignInRefused(
            f"Sign-in through {app.name} is not set up: its client secret variable {name} is empty. Tell staff."
        )
    return value


class Adapter(OpenIDConnectOAuth2Adapter):
    state: dict[str, Any] | None = None  # set by CallbackView once the state is looked up

    @property
    def openid_config(self) -> dict[str, Any]:
        app = self.get_provider().app
        try:
            config: dict[str, Any] = super().openid_config
        except (requests.RequestException, ValueError) as exc:
            raise SignInRefused(f"{app.name} cannot be reached now ({type(exc).__name__}); try again later.") from None
        issuer = app.settings["server_url"].rstrip("/")
        if str(config.get("issuer", "")).rstrip("/") != issuer:
            raise SignInRefused(f"The provider's discovery document names another issuer than {issuer}.")
        return config

    def get_access_token_data(self, request: HttpRequest, app: Any, client: OAuth2Client, **kwargs: Any) -> Any:
        # The only use of the secret: the code's exchange. Read now, so that a rotated
        # secret needs no restart, and kept in no object that lives longer than this request.
        client.consumer_secret = _secret(app)
        return super().get_access_token_data(request, app, client, **kwargs)

    def _decode_id_token(self, app: Any, id_token: str) -> dict[str, Any]:
        config = self.openid_config
        try:
            algorithm, key = jwtkit.fetch_key(id_token, config["jwks_uri"], jwtkit.lookup_kid_jwk)
            claims: dict[str, Any] = jwt.decode(
                id_token,
                key=key,
                algorithms=[algorithm],
                audience=app.client_id,
                issuer=config["issuer"],
                leeway=settings.COLLAB_OIDC_CLOCK_SKEW_S,
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.InvalidAudienceError:
            raise SignInRefused(f"{app.name} issued this sign-in for another application, not for collab.") from None
        except jwt.ExpiredSignatureError:
            raise SignInRefused(
                f"The sign-in from {app.name} has expired. Try again; if it happens every time, "
                "the clocks of collab and the provider disagree."
            ) from None
        except (jwt.ImmatureSignatureError, jwt.InvalidIssuedAtError):
            raise SignInRefused(f"The sign-in from {app.name} is dated in the future; the clocks disagree.") from None
        except jwt.InvalidSignatureError:
            raise SignInRefused(f"The sign-in's signature does not match {app.name}'s published keys.") from None
        except jwt.InvalidIssuerError:
            raise SignInRefused(f"The sign-in was issued by another issuer than {app.name}.") from None
        except (jwt.PyJWTError, KeyError, ValueError) as exc:
            raise SignInRefused(f"The sign-in from {app.name} is not valid ({exc}).") from None
        expected = (self.state or {}).get("nonce")
        if not expected or not secrets.compare_digest(str(claims.get("nonce", "")), expected):
            raise SignInRefused(f"The sign-in from {app.name} does not belong to this attempt (nonce). Try again.")
        return claims


class Provider(OpenIDConnectProvider):
    """allauth's provider; every authorization request carries a nonce kept in its state."""

    oauth2_adapter_class = Adapter

    def get_oauth2_adapter(self, request: HttpRequest) -> Adapter:
        return Adapter(request, self.app.provider_id)

    def redirect(
        self, request: HttpRequest, process: Any, next_url: Any = None, data: Any = None, **kwargs: Any
    ) -> Any:
        nonce = secrets.token_urlsafe(32)
        auth_params = dict(kwargs.pop("auth_params", None) or self.get_auth_params())
        auth_params["nonce"] = nonce
        # The state is stashed in the session with every extra keyword: the nonce with it.
        try:
            return super().redirect(request, process, next_url, data, auth_params=auth_params, nonce=nonce, **kwargs)
        except SignInRefused as exc:  # discovery failed before allauth's own handler
            return render_authentication_error(request, self, exception=exc)


class CallbackView(OAuth2CallbackView):
    def _get_state(self, request: HttpRequest, provider: Any) -> Any:
        state, response = super()._get_state(request, provider)
        assert isinstance(self.adapter, Adapter)
        self.adapter.state = state
        return state, response


def configured_apps() -> list[dict[str, Any]]:
    """The providers of COLLAB_OIDC_PROVIDERS, in order, as allauth's settings-based apps."""
    apps: list[dict[str, Any]] = settings.SOCIALACCOUNT_PROVIDERS.get("openid_connect", {}).get("APPS", [])
    return apps


def end_session_endpoint(request: HttpRequest, provider_id: str) -> str | None:
    """The provider's RP-initiated logout endpoint, from the discovery document the sign-in
    reads (its issuer checked); None when it offers none. SignInRefused when unreachable."""
    endpoint = Adapter(request, provider_id).openid_config.get("end_session_endpoint")
    return str(endpoint) if endpoint else None


def _provider_or_404(provider_id: str) -> None:
    if not any(app["provider_id"] == provider_id for app in configured_apps()):
        raise Http404(f"No sign-in provider {provider_id!r} is configured.")


@login_not_required
@require_http_methods(["GET", "POST"])
def login(request: HttpRequest, provider_id: str) -> HttpResponse:
    _provider_or_404(provider_id)
    response: HttpResponse = OAuth2LoginView.adapter_view(Adapter(request, provider_id))(request)
    return response


@login_not_required
@require_http_methods(["GET"])
def callback(request: HttpRequest, provider_id: str) -> HttpResponse:
    _provider_or_404(provider_id)
    response: HttpResponse = CallbackView.adapter_view(Adapter(request, provider_id))(request)
    return response
