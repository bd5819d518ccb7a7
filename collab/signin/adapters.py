"""Who may sign in through a provider, and as whom (docs/architecture/sign-in.md#accounts):

- a returning person is found by the provider's subject (allauth's SocialAccount: provider
  id and `sub`), whatever their email is now;
- a first sign-in is linked to the one existing account with that email, only when the
  provider says `email_verified` is true; an unverified or missing email is refused
  (someone who can set an unverified address at the provider must not take over the account
  that has it here);
- with ALLOWED_GROUPS set, only members of one of them (the groups claim) may sign in; with
  STAFF_GROUPS set, membership decides `is_staff` at every sign-in (never `is_superuser`).
"""

from __future__ import annotations

from typing import Any

from allauth.account.adapter import DefaultAccountAdapter
from allauth.account.signals import user_logged_in
from allauth.core.exceptions import ImmediateHttpResponse
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, User
from django.dispatch import receiver
from django.http import HttpRequest
from django.shortcuts import render

# The provider a session signed in through: logout then ends the provider's session too (views.py).
SESSION_PROVIDER = "collab_oidc_provider"


def refuse(request: HttpRequest, provider_name: str, message: str) -> ImmediateHttpResponse:
    response = render(
        request, "socialaccount/authentication_error.html", {"message": message, "provider": provider_name}, status=403
    )
    return ImmediateHttpResponse(response)


def claims_of(extra_data: dict[str, Any]) -> dict[str, Any]:
    """The ID token's claims, with the userinfo endpoint's over them (allauth keeps both)."""
    return {**(extra_data.get("id_token") or {}), **(extra_data.get("userinfo") or {})}


def groups_of(claims: dict[str, Any], claim: str) -> set[str]:
    value = claims.get(claim) or []
    if isinstance(value, str):
        value = [value]
    # Keycloak writes group paths ("/collab-admins"): either form matches.
    return {str(g) for g in value} | {str(g).lstrip("/") for g in value}


def verified(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


class AccountAdapter(DefaultAccountAdapter):
    def is_open_for_signup(self, request: HttpRequest) -> bool:
        return bool(settings.COLLAB_PASSWORD_LOGIN)  # allauth's own signup form: never routed (urls.py)

    def login(self, request: HttpRequest, user: AbstractBaseUser) -> None:
        # The backend that reads the session back; axes' backend (first) only authenticates.
        user.backend = "django.contrib.auth.backends.ModelBackend"  # type: ignore[attr-defined]
        super().login(request, user)


class SocialAccountAdapter(DefaultSocialAccountAdapter):
    def is_open_for_signup(self, request: HttpRequest, sociallogin: Any) -> bool:
        return True  # a person the provider vouches for gets an account, password login or not

    def send_notification_mail(self, *args: Any, **kwargs: Any) -> None:
        return None  # collab sends no email

    def pre_social_login(self, request: HttpRequest, sociallogin: Any) -> None:
        app = sociallogin.account.get_provider().app
        options = app.settings
        claims = claims_of(sociallogin.account.extra_data)
        groups = groups_of(claims, options.get("groups_claim", "groups"))
        allowed = set(options.get("allowed_groups") or [])
        if allowed and not groups & allowed:
            raise refuse(request, app.name, f"Your account at {app.name} is not in a group allowed to use collab.")
        if not sociallogin.is_existing:
            self._link_or_refuse(request, sociallogin, app.name, claims)
        elif not sociallogin.user.is_active:  # allauth would redirect to its own page for that
            raise refuse(request, app.name, "Your collab account is deactivated. Ask staff.")
        staff_groups = set(options.get("staff_groups") or [])
        if staff_groups:
            sociallogin.user.is_staff = bool(groups & staff_groups)
            if sociallogin.user.pk is not None:
                sociallogin.user.save(update_fields=["is_staff"])

    def _link_or_refuse(self, request: HttpRequest, sociallogin: Any, provider: str, claims: dict[str, Any]) -> None:
        email = str(claims.get("email") or "").strip()
        if not email:
            raise refuse(request, provider, f"{provider} did not tell collab your email address (scope email).")
        if not verified(claims.get("email_verified")):
            raise refuse(
                request,
                provider,
                f"{provider} has not verified your email address {email}; collab signs in only with a verified one. "
                f"Verify it at {provider}, or ask its administrators to.",
            )
        same = list(User.objects.filter(email__iexact=email)[:2])
        if len(same) > 1:
            raise refuse(request, provider, f"Several accounts here have the address {email}; ask staff to merge them.")
        if same:
            if not same[0].is_active:
                raise refuse(request, provider, "The account with your email address is deactivated.")
            sociallogin.connect(request, same[0])


@receiver(user_logged_in)
def _remember_the_provider(sender: Any, request: HttpRequest, user: Any, **kwargs: Any) -> None:
    sociallogin = kwargs.get("sociallogin")
    if sociallogin is not None:
        request.session[SESSION_PROVIDER] = sociallogin.account.provider
