"""Signing out after a sign-in through a provider (issue 37; docs/architecture/sign-in.md#signing-out):
the collab session ends and its open sockets close (`session.ended`, 4403, as any logout:
collab/chat/services/sessions.py), then the browser goes to the provider's
end_session_endpoint, and back to collab's login page from there. A provider that offers
none: collab's login page at once."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from tests.conftest import World, connected
from tests.oidc import (  # noqa: F401 (fixtures: idp_fixture, oidc_fixture)
    CLIENT_ID,
    LoopbackProvider,
    idp_fixture,
    oidc_fixture,
    sign_in,
    signed_in_as,
)
from tests.test_account_sockets import closed_with

pytestmark = pytest.mark.django_db(transaction=True)


def alice_signs_in(world: World, oidc: LoopbackProvider) -> Client:
    """alice (room lab's owner) through the provider: linked by her verified email."""
    world.alice.email = "alice@example.com"
    world.alice.save(update_fields=["email"])
    client = Client()
    assert sign_in(client, oidc).status_code == 302
    assert signed_in_as(client) == "alice"
    return client


async def test_logout_closes_the_sessions_sockets_and_ends_the_providers_session(
    world: World, oidc: LoopbackProvider
) -> None:
    client = await sync_to_async(alice_signs_in)(world, oidc)
    cookie = client.cookies["sessionid"].value
    async with connected(world.alice, "lab", cookie=cookie) as (ok, _, alice):
        assert ok
        await alice.until(lambda f: f.snapshots >= 1)
        out = await sync_to_async(client.post)("/accounts/logout/")
        assert await closed_with(alice, "session.ended") == 4403
    assert out.status_code == 302
    target = urlsplit(out["Location"])
    assert f"{target.scheme}://{target.netloc}{target.path}" == f"{oidc.url}/logout"
    query = parse_qs(target.query)
    assert query["client_id"] == [CLIENT_ID]
    assert query["post_logout_redirect_uri"] == ["http://testserver/accounts/login/"]
    assert await sync_to_async(signed_in_as)(client) is None
    # The browser follows it: the provider ends its session and sends it back to collab.
    back = await sync_to_async(oidc.follow)(out["Location"])
    assert back == "http://testserver/accounts/login/"
    assert oidc.log("logout")[-1]["client_id"] == CLIENT_ID


async def test_without_an_end_session_endpoint_logout_goes_to_the_login_page(
    world: World, oidc: LoopbackProvider
) -> None:
    oidc.control(end_session=False)
    client = await sync_to_async(alice_signs_in)(world, oidc)
    out = await sync_to_async(client.post)("/accounts/logout/")
    assert out.status_code == 302 and out["Location"] == "/accounts/login/"
    assert await sync_to_async(signed_in_as)(client) is None


async def test_a_password_sessions_logout_stays_on_collab(world: World, oidc: LoopbackProvider) -> None:
    def password_login() -> Client:
        client = Client()
        assert client.post("/accounts/login/", {"username": "bob", "password": "pw-bob-123"}).status_code == 302
        return client

    client = await sync_to_async(password_login)()
    out = await sync_to_async(client.post)("/accounts/logout/")
    assert out.status_code == 302 and out["Location"] == "/accounts/login/"
