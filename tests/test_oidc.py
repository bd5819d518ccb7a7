"""Single sign-on through OpenID Connect (issue 37, item 1; docs/architecture/sign-in.md),
against a real provider process on loopback (tests/oidc_provider.py): collab's side runs
in the Django test client, the provider's pages are fetched as a browser would.

A full sign-in (discovery, PKCE, state, nonce, a signed ID token, userinfo); a return
found by the provider's subject; a first sign-in linked by verified email only; each
refusal with its message (wrong audience, expired, bad signature, nonce, replayed state,
unverified email, not in the allowed group); staff by group; passwords off; the secret
never stored."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from allauth.socialaccount.models import SocialAccount, SocialApp, SocialToken
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from collab.oidc_settings import providers_from_env
from tests.oidc import (  # noqa: F401 (fixtures: idp_fixture, oidc_fixture)
    SECRET,
    SECRET_VARIABLE,
    LoopbackProvider,
    idp_fixture,
    oidc_fixture,
    path_of,
    sign_in,
    signed_in_as,
)

pytestmark = pytest.mark.django_db


def test_a_full_sign_in_makes_an_account_and_a_return_finds_it_by_subject(oidc: LoopbackProvider) -> None:
    client = Client()
    done = sign_in(client, oidc, next_url="/r/lab/")
    assert done.status_code == 302 and done["Location"] == "/r/lab/"
    assert signed_in_as(client) == "alice"
    alice = User.objects.get(username="alice")
    assert alice.email == "alice@example.com" and not alice.has_usable_password() and not alice.is_staff
    assert SocialAccount.objects.get(user=alice).uid == "u-alice"
    # Discovery, then an authorization request with PKCE S256 and a nonce; the code was
    # exchanged with the verifier; the ID token was checked, and userinfo read.
    asked = oidc.log("authorize")[-1]
    assert asked["code_challenge_method"] == "S256" and asked["nonce"] and asked["state"]
    assert oidc.log("token")[-1]["pkce_ok"] is True

    # Back later with another address at the provider: the same account, by subject.
    oidc.control(user={"sub": "u-alice", "email": "alice.new@example.com", "email_verified": False,
                       "preferred_username": "alice2", "groups": ["collab-users"]})  # fmt: skip
    again = Client()
    assert sign_in(again, oidc).status_code == 302
    assert signed_in_as(again) == "alice"
    assert User.objects.count() == 1


def test_a_first_sign_in_is_linked_by_verified_email_to_the_existing_account(oidc: LoopbackProvider) -> None:
    bob = User.objects.create_user("bob", email="Bob@Example.com", password="pw-bob-123")
    oidc.control(user={"sub": "u-bob", "email": "bob@example.com", "email_verified": True,
                       "preferred_username": "bobby", "groups": ["collab-users"]})  # fmt: skip
    client = Client()
    assert sign_in(client, oidc).status_code == 302
    assert signed_in_as(client) == "bob"
    assert SocialAccount.objects.get(uid="u-bob").user == bob
    assert User.objects.get(pk=bob.pk).check_password("pw-bob-123")  # the password stays


def refused(response: Any, message: str, client: Client) -> None:
    assert response.status_code in (401, 403), response
    text = response.content.decode()
    assert 'id="signin-error"' in text and message in text, text
    assert signed_in_as(client) is None


def test_an_unverified_email_is_refused_and_never_linked(oidc: LoopbackProvider) -> None:
    User.objects.create_user("bob", email="bob@example.com", password="pw-bob-123")
    oidc.control(user={"sub": "u-mallory", "email": "bob@example.com", "email_verified": False,
                       "preferred_username": "mallory", "groups": ["collab-users"]})  # fmt: skip
    client = Client()
    refused(sign_in(client, oidc), "has not verified your email address bob@example.com", client)
    assert not SocialAccount.objects.exists() and User.objects.count() == 1


@pytest.mark.parametrize(
    ("controls", "message"),
    [
        ({"audience": "someone-else"}, "issued this sign-in for another application"),
        ({"expired_s": 600}, "has expired"),
        ({"bad_signature": True}, "signature does not match"),
        ({"nonce": "not-the-one-asked-for"}, "does not belong to this attempt (nonce)"),
    ],
    ids=["wrong-audience", "expired", "bad-signature", "wrong-nonce"],
)
def test_a_bad_id_token_is_refused(oidc: LoopbackProvider, controls: dict[str, Any], message: str) -> None:
    oidc.control(**controls)
    client = Client()
    refused(sign_in(client, oidc), message, client)
    assert not User.objects.exists()


def test_a_clock_skew_within_the_bound_is_accepted(oidc: LoopbackProvider, settings: Any) -> None:
    settings.COLLAB_OIDC_CLOCK_SKEW_S = 60
    oidc.control(expired_s=30)  # exp 30 s ago: a provider's clock behind by that much
    client = Client()
    assert sign_in(client, oidc).status_code == 302 and signed_in_as(client) == "alice"


def test_a_replayed_state_is_refused(oidc: LoopbackProvider) -> None:
    client = Client()
    start = client.post("/accounts/oidc/test/login/")
    callback = path_of(oidc.approve(start["Location"]))
    assert client.get(callback).status_code == 302
    client.logout()
    refused(client.get(callback), "already used or expired", client)
    stranger = Client()  # another browser, with a state it never started
    refused(stranger.get(callback), "already used or expired", stranger)


def test_groups_decide_who_may_sign_in_and_who_is_staff(oidc: LoopbackProvider) -> None:
    oidc.control(user={"sub": "u-eve", "email": "eve@example.com", "email_verified": True,
                       "preferred_username": "eve", "groups": ["marketing"]})  # fmt: skip
    client = Client()
    refused(sign_in(client, oidc), "not in a group allowed to use collab", client)

    oidc.control(user={"sub": "u-dan", "email": "dan@example.com", "email_verified": True,
                       "preferred_username": "dan", "groups": ["/collab-users", "/collab-admins"]})  # fmt: skip
    client = Client()
    assert sign_in(client, oidc).status_code == 302
    assert User.objects.get(username="dan").is_staff
    oidc.control(user={"sub": "u-dan", "email": "dan@example.com", "email_verified": True,
                       "preferred_username": "dan", "groups": ["collab-users"]})  # fmt: skip
    assert sign_in(Client(), oidc).status_code == 302
    assert not User.objects.get(username="dan").is_staff  # out of the group: staff no more


def test_the_secret_is_read_from_its_variable_and_never_stored(oidc: LoopbackProvider, monkeypatch: Any) -> None:
    assert sign_in(Client(), oidc).status_code == 302
    assert not SocialApp.objects.exists() and not SocialToken.objects.exists()
    from io import StringIO

    dump = StringIO()
    call_command("dumpdata", stdout=dump)
    assert SECRET not in dump.getvalue()

    monkeypatch.delenv(SECRET_VARIABLE)
    client = Client()
    refused(sign_in(client, oidc), f"its client secret variable {SECRET_VARIABLE} is empty", client)


def test_with_passwords_off_the_provider_is_the_only_way_in(oidc: LoopbackProvider, settings: Any) -> None:
    settings.COLLAB_PASSWORD_LOGIN = False
    User.objects.create_user("carol", password="pw-carol-123", is_staff=True)
    client = Client()
    page = client.get("/accounts/login/").content.decode()
    assert "Sign in with Test SSO" in page and 'name="password"' not in page and "Sign up" not in page
    answer = client.post("/accounts/login/", {"username": "carol", "password": "pw-carol-123"})
    assert answer.status_code == 403 and b"only through Test SSO" in answer.content
    assert signed_in_as(client) is None
    assert client.post("/admin/login/", {"username": "carol", "password": "pw-carol-123"}).status_code == 403
    assert client.get("/admin/login/")["Location"].startswith("/accounts/login/")
    assert signed_in_as(client) is None
    assert client.get("/accounts/signup/").status_code == 403
    signup = client.post("/accounts/signup/", {"username": "z", "password1": "x-9a8b7c6d", "password2": "x-9a8b7c6d"})
    assert signup.status_code == 403 and not User.objects.filter(username="z").exists()
    assert sign_in(client, oidc).status_code == 302 and signed_in_as(client) == "alice"


def test_with_passwords_on_both_ways_are_offered(oidc: LoopbackProvider) -> None:
    User.objects.create_user("carol", password="pw-carol-123")
    client = Client()
    page = client.get("/accounts/login/").content.decode()
    assert "Sign in with Test SSO" in page and 'name="password"' in page
    assert client.post("/accounts/login/", {"username": "carol", "password": "pw-carol-123"}).status_code == 302
    assert signed_in_as(client) == "carol"


def test_an_unknown_provider_is_a_404(oidc: LoopbackProvider) -> None:
    answer = Client().post("/accounts/oidc/nope/login/")
    assert answer.status_code == 404


def test_declined_or_failed_at_the_provider_says_so(oidc: LoopbackProvider) -> None:
    client = Client()
    start = client.post("/accounts/oidc/test/login/")
    state = parse_qs(urlsplit(start["Location"]).query)["state"][0]
    declined = client.get(f"/accounts/oidc/test/login/callback/?error=access_denied&state={state}", follow=True)
    assert declined.redirect_chain[-1][0] == "/accounts/oidc/cancelled/"
    assert b"You cancelled signing in at the provider" in declined.content
    start = client.post("/accounts/oidc/test/login/")
    state = parse_qs(urlsplit(start["Location"]).query)["state"][0]
    failed = client.get(
        f"/accounts/oidc/test/login/callback/?error=temporarily_unavailable&error_description=down&state={state}"
    )
    refused(failed, "Test SSO answered with an error: temporarily_unavailable (down).", client)


def test_a_next_off_this_site_is_not_followed(oidc: LoopbackProvider) -> None:
    client = Client()
    done = sign_in(client, oidc, next_url="https://evil.example/")
    assert done.status_code == 302 and done["Location"] == "/"


def test_a_get_to_a_providers_login_url_asks_first(oidc: LoopbackProvider) -> None:
    """A link or image elsewhere cannot start a sign-in (login CSRF): a GET shows a button."""
    page = Client().get("/accounts/oidc/test/login/")
    assert page.status_code == 200 and b"Continue to Test SSO" in page.content  # not a redirect to the provider


def test_a_provider_that_cannot_be_reached_is_named(oidc: LoopbackProvider, settings: Any) -> None:
    from tests.servers import free_port

    down = {**oidc.env(), "COLLAB_OIDC_TEST_ISSUER": f"http://127.0.0.1:{free_port()}"}
    settings.SOCIALACCOUNT_PROVIDERS = {"openid_connect": {
        **settings.SOCIALACCOUNT_PROVIDERS["openid_connect"], "APPS": providers_from_env(down),
    }}  # fmt: skip
    client = Client()
    refused(client.post("/accounts/oidc/test/login/"), "Test SSO cannot be reached now (ConnectionError)", client)


def test_a_deactivated_account_is_refused(oidc: LoopbackProvider) -> None:
    assert sign_in(Client(), oidc).status_code == 302
    User.objects.filter(username="alice").update(is_active=False)
    client = Client()
    refused(sign_in(client, oidc), "Your collab account is deactivated", client)
