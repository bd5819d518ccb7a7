"""The test OpenID Connect provider (tests/oidc_provider.py) as the tests use it: started as
a process on loopback and waited for (its "listening" line), its test controls, and the
part of a sign-in that a browser does at the provider (the sign-in form, then the redirect
back to collab's callback)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from django.contrib.auth.models import User
from django.test import Client

from collab.oidc_settings import providers_from_env
from tests.servers import ROOT

CLIENT_ID = "collab-tests"
SECRET_VARIABLE = "COLLAB_TEST_OIDC_SECRET"
SECRET = "test-client-secret-4c1d"  # only ever in the environment, never stored (test_oidc.py checks)


@dataclass
class LoopbackProvider:
    url: str
    proc: subprocess.Popen[str]

    def control(self, **controls: Any) -> None:
        requests.post(f"{self.url}/_control", json=controls, timeout=5).raise_for_status()

    def reset(self) -> None:
        from tests.oidc_provider import DEFAULT_USER

        self.control(
            user=dict(DEFAULT_USER), audience=None, expired_s=0, bad_signature=False, nonce=None, end_session=True
        )

    def log(self, event: str | None = None) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = requests.get(f"{self.url}/_control/log", timeout=5).json()["log"]
        return [e for e in entries if event is None or e["event"] == event]

    def env(self, provider_id: str = "test", **extra: str) -> dict[str, str]:
        """collab's COLLAB_OIDC_* variables for this provider."""
        prefix = f"COLLAB_OIDC_{provider_id.upper()}_"
        return {
            "COLLAB_OIDC_PROVIDERS": provider_id,
            prefix + "ISSUER": self.url,
            prefix + "CLIENT_ID": CLIENT_ID,
            prefix + "SECRET_VARIABLE": SECRET_VARIABLE,
            prefix + "SCOPES": "openid profile email groups",
            prefix + "LABEL": "Test SSO",
            SECRET_VARIABLE: SECRET,
            **{prefix + k: v for k, v in extra.items()},
        }

    def apps(self, **extra: str) -> list[dict[str, Any]]:
        return providers_from_env(self.env(**extra))

    def follow(self, url: str) -> str:
        """A browser's visit to one of the provider's URLs that redirects: where it goes next."""
        answer = requests.get(url, allow_redirects=False, timeout=5)
        assert answer.status_code == 302, answer.text
        return str(answer.headers["Location"])

    def approve(self, authorize_url: str) -> str:
        """What the person does at the provider: open its sign-in page, press the button.
        Returns the callback URL the provider sends the browser back to."""
        page = requests.get(authorize_url, timeout=5)
        assert page.status_code == 200, page.text
        request_id = re.search(r'name="request_id" value="([^"]+)"', page.text)
        assert request_id, page.text
        back = requests.post(
            f"{self.url}/authorize", data={"request_id": request_id.group(1)}, allow_redirects=False, timeout=5
        )
        assert back.status_code == 302, back.text
        return str(back.headers["Location"])


@contextmanager
def running_provider() -> Iterator[LoopbackProvider]:
    env = {**os.environ, SECRET_VARIABLE: SECRET, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.oidc_provider", "--client-id", CLIENT_ID, "--client-secret-env", SECRET_VARIABLE],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until it listens, or "" if it died first
        if not line.startswith("listening "):
            raise RuntimeError(f"the test OIDC provider did not start (exit {proc.wait(10)})")
        yield LoopbackProvider(line.split()[1], proc)
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def path_of(url: str) -> str:
    """The path and query of a URL: what the Django test client is given."""
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


@pytest.fixture(scope="module", name="idp")
def idp_fixture() -> Iterator[LoopbackProvider]:
    with running_provider() as provider:
        yield provider


@pytest.fixture(name="oidc")
def oidc_fixture(idp: LoopbackProvider, settings: Any, monkeypatch: pytest.MonkeyPatch) -> LoopbackProvider:
    """collab configured for the test provider (as COLLAB_OIDC_* would), the provider reset."""
    idp.reset()
    monkeypatch.setenv(SECRET_VARIABLE, SECRET)
    settings.SOCIALACCOUNT_PROVIDERS = {**settings.SOCIALACCOUNT_PROVIDERS, "openid_connect": {
        **settings.SOCIALACCOUNT_PROVIDERS["openid_connect"], "APPS": idp.apps(ALLOWED_GROUPS="collab-users",
                                                                             STAFF_GROUPS="collab-admins"),
    }}  # fmt: skip
    return idp


def sign_in(client: Client, idp: LoopbackProvider, next_url: str = "") -> Any:
    """The login page's button, the provider's sign-in form, and collab's callback: its answer."""
    page = client.get("/accounts/login/")
    assert b"Sign in with Test SSO" in page.content
    start = client.post("/accounts/oidc/test/login/" + (f"?next={next_url}" if next_url else ""))
    assert start.status_code == 302 and start["Location"].startswith(f"{idp.url}/authorize?"), start
    return client.get(path_of(idp.approve(start["Location"])))


def signed_in_as(client: Client) -> str | None:
    user_id = client.session.get("_auth_user_id")
    return User.objects.get(pk=user_id).username if user_id else None
