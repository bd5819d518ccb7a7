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

import requests

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
