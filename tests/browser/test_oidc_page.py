"""Single sign-on in a real browser (issue 37, "Done when"): Chromium opens collab's login
page (passwords off: the provider's button only), signs in at the test OpenID Connect
provider (tests/oidc_provider.py, a process on loopback), lands on the rooms page as the
person the provider named, and logs out through the provider back to the login page."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import axe_violations, screenshot
from tests.oidc import LoopbackProvider, running_provider
from tests.servers import Daphne, migrate, start_daphne

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def sso_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daphne, LoopbackProvider]]:
    with running_provider() as idp:
        env = {
            **os.environ,
            **idp.env(ALLOWED_GROUPS="collab-users"),
            "COLLAB_PASSWORD_LOGIN": "0",
            "DJANGO_SETTINGS_MODULE": "collab.settings",
            "COLLAB_SQLITE_PATH": str(Path(tmp_path_factory.mktemp("sso")) / "site.sqlite3"),
            "COLLAB_REDIS_PREFIX": f"sso{uuid.uuid4().hex[:8]}:",
            "COLLAB_LLM_BASE_URL": "http://127.0.0.1:9/v1",  # never called: no room is opened
        }
        env.pop("DATABASE_URL", None)
        env.pop("REDIS_URL", None)
        migrate(env)
        server = start_daphne(env)
        try:
            yield server, idp
        finally:
            server.stop()


def test_signing_in_and_out_through_the_provider_in_chromium(
    chromium: Any, sso_site: tuple[Daphne, LoopbackProvider]
) -> None:
    site, idp = sso_site
    page = chromium.new_context().new_page()
    page.goto(f"{site.url}/accounts/login/")
    assert page.locator("input[name=password]").count() == 0  # passwords are off
    assert axe_violations(page) == []
    screenshot(page, "oidc-login")
    page.get_by_role("button", name="Sign in with Test SSO").click()
    page.wait_for_url(f"{idp.url}/authorize?**")
    page.locator("#approve").click()  # the provider's own sign-in page
    page.wait_for_url(f"{site.url}/")
    assert page.locator("header .who").inner_text() == "alice"
    screenshot(page, "oidc-signed-in")
    asked = idp.log("authorize")[-1]
    assert asked["code_challenge_method"] == "S256" and asked["nonce"]
    assert idp.log("token")[-1]["pkce_ok"] is True

    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(f"{site.url}/accounts/login/")
    assert idp.log("logout"), "the provider's end_session_endpoint was not visited"
    page.goto(f"{site.url}/")
    page.wait_for_url(f"{site.url}/accounts/login/?next=/")  # signed out of collab
    page.context.close()
