"""Real browsers for the tests: Debian's Chromium (never a downloaded one) driven by
Playwright, against a real Daphne on the simulated model.

Chromium comes from the system (`.ci/run` installs Debian's package `chromium`); where
it is absent the browser tests skip with a notice, except in CI (`CI=true`), where
they fail. Screenshots go to `COLLAB_TEST_ARTIFACTS` (default `.cache/test-artifacts`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.test_e2e import free_port, login, wait_http

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("COLLAB_TEST_ARTIFACTS", ROOT / ".cache" / "test-artifacts"))
PASSWORD = "browser-pw-123"

SETUP = f"""
from django.contrib.auth.models import User
from collab.chat.actions import providers, rooms
from collab.chat.models import Assistant, Membership
alice = User.objects.create_user("alice", password="{PASSWORD}")
bob = User.objects.create_user("bob", password="{PASSWORD}")
room = rooms.create_room(alice, "Lab", topic="in a real browser")
Membership.objects.create(room=room, user=bob)
provider = providers.ensure_default_assistant().provider
for h, model in (("a", "sim"), ("b", "sim"), ("slow", "sim+slow")):
    room.assistants.add(Assistant.objects.create(handle=h, display_name=h.upper(), provider=provider, model=model))
"""
# The model's speed: @a and @b at 750 tokens/s (a fast provider's), @slow at a tenth of it
# (a reply of SIM_TOKENS takes 4 s: long enough to stop, reload or restart mid-reply).
SIM_TPS, SIM_TOKENS = 750.0, 300


def chromium_path() -> str:
    found = os.environ.get("COLLAB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(found).exists():
        message = "Debian's chromium is not installed (apt-get install chromium): the browser tests need it"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return found


@dataclass
class Site:
    """A Daphne process on a SQLite file of its own, with alice (owner) and bob in room lab."""

    url: str
    env: dict[str, str]
    port: int
    proc: subprocess.Popen[bytes] | None = None
    cookies: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "collab.asgi:application"]
        self.proc = subprocess.Popen(command, env=self.env, cwd=ROOT)
        wait_http(f"{self.url}/healthz", self.proc)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    def cookie(self, username: str) -> str:
        if username not in self.cookies:
            self.cookies[username] = login(self.url, username, PASSWORD)
        return self.cookies[username]

    def shell(self, code: str) -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code],
            env=self.env, cwd=ROOT, check=True, capture_output=True, text=True,
        )  # fmt: skip
        return done.stdout


@pytest.fixture(scope="module")
def browser_sim() -> Iterator[str]:
    from collab.simulator.testing import running_simulator_app

    with running_simulator_app(tps=SIM_TPS, ttft_ms=30, reply_tokens=SIM_TOKENS, seed=2) as (url, _app):
        yield url


@pytest.fixture(scope="module")
def site(browser_sim: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    env = {
        **os.environ,
        "COLLAB_LLM_BASE_URL": browser_sim,
        "COLLAB_LLM_MODEL": "sim",
        "DJANGO_SETTINGS_MODULE": "collab.settings",
        "COLLAB_SQLITE_PATH": str(tmp_path_factory.mktemp("browser") / "site.sqlite3"),
        "COLLAB_REDIS_PREFIX": f"browser{uuid.uuid4().hex[:8]}:",
    }
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"], env=env, check=True, cwd=ROOT)
    port = free_port()
    site = Site(f"http://127.0.0.1:{port}", env, port)
    site.shell(SETUP)
    site.start()
    try:
        yield site
    finally:
        site.stop()


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    path = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield browser
        browser.close()


def open_room(chromium: Any, site: Site, username: str, **context_options: Any) -> Any:
    """A new browser context logged in as `username`, on the room page, its socket live."""
    context = chromium.new_context(**context_options)
    host = site.url.split("//", 1)[1].split(":")[0]
    context.add_cookies([{"name": "sessionid", "value": site.cookie(username), "domain": host, "path": "/"}])
    page = context.new_page()
    page.goto(f"{site.url}/r/lab/")
    page.wait_for_selector("#conn.ok")
    return page


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path
