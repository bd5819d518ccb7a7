"""The login page (password form and provider buttons), the password switch
(COLLAB_PASSWORD_LOGIN), and logout through the provider (docs/architecture/sign-in.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from collab.chat import views as chat_views
from collab.signin import oidc
from collab.signin.adapters import SESSION_PROVIDER

log = logging.getLogger(__name__)


def providers() -> list[dict[str, Any]]:
    """The configured providers, in order: id, button label and the settings-based app."""
    return [{"id": a["provider_id"], "label": a["name"], "app": a} for a in oidc.configured_apps()]


def password_off(request: HttpRequest) -> HttpResponse:
    return render(request, "registration/password_off.html", {"providers": providers()}, status=403)


class LoginView(auth_views.LoginView):
    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["providers"] = providers()  # password_login: the context processor (context.py)
        return context

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.COLLAB_PASSWORD_LOGIN:
            return password_off(request)
        return super().post(request, *args, **kwargs)


login = require_http_methods(["GET", "POST"])(LoginView.as_view())


@login_not_required
@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if not settings.COLLAB_PASSWORD_LOGIN:
        return password_off(request)
    return chat_views.signup(request)


def admin_gate(admin_login: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The admin's own password form, closed when passwords are off: staff sign in on the
    login page (through the provider) and then open the admin."""

    @login_not_required
    def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.COLLAB_PASSWORD_LOGIN:
            if request.method == "POST":
                return password_off(request)
            return redirect_to_login(request.GET.get("next", reverse("admin:index")))
        return admin_login(request, *args, **kwargs)

    return view


def end_session_url(request: HttpRequest, provider_id: str) -> str | None:
    """The provider's RP-initiated logout URL (its discovery's end_session_endpoint), back to
    collab's login page afterwards; None when it offers none or cannot be reached."""
    app = next((p["app"] for p in providers() if p["id"] == provider_id), None)
    if app is None:
        return None
    try:
        endpoint = oidc.end_session_endpoint(request, provider_id)
    except oidc.SignInRefused as exc:
        log.warning("logout: %s discovery unusable (%s); ending the collab session only", provider_id, exc)
        return None
    if not endpoint:
        return None
    back = request.build_absolute_uri(reverse(settings.LOGOUT_REDIRECT_URL))
    query = urlencode({"client_id": app["client_id"], "post_logout_redirect_uri": back})
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


@require_http_methods(["POST"])
def logout(request: HttpRequest) -> HttpResponseBase:
    """Django's logout (user_logged_out closes the session's sockets: chat/services/sessions.py),
    then the provider's logout when the session signed in through one that offers it."""
    provider_id = request.session.get(SESSION_PROVIDER)
    response = auth_views.LogoutView.as_view()(request)
    target = end_session_url(request, provider_id) if provider_id else None
    return HttpResponseRedirect(target) if target else response


@login_not_required
def provider_cancelled(request: HttpRequest) -> HttpResponse:
    """allauth's redirect when the person declined at the provider (error=access_denied)."""
    message = "You cancelled signing in at the provider; nothing was changed."
    context = {"message": message, "title": "Sign-in cancelled"}
    return render(request, "socialaccount/authentication_error.html", context, status=200)


@login_not_required
def provider_signup_conflict(request: HttpRequest) -> HttpResponse:
    """allauth's redirect to its sign-up form when it cannot make the account on its own (an
    address it already knows for another account); collab has no such form: staff decide."""
    request.session.pop("socialaccount_sociallogin", None)
    message = "Another account here already has your email address, so no account was made. Ask staff to link them."
    return render(request, "socialaccount/authentication_error.html", {"message": message}, status=409)
