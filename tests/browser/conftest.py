"""Real browsers for the tests: Debian's Chromium (never a downloaded one) driven by
Playwright, against a real Daphne on the simulated model.

Chromium comes from the system (`.ci/run` installs Debian's package `chromium`); where
it is absent the browser tests skip with a notice, except in CI (`CI=true`), where
they fail. Screenshots go to `COLLAB_TEST_ARTIFACTS` (default `.cache/test-artifacts`).
axe-core (vendor/axe.min.js, see vendor/README.md) is injected into pages by
`axe_violations`: nothing is fetched from the network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.servers import ROOT, Daphne, free_port, login, manage, migrate, start_daphne

if TYPE_CHECKING:
    from collab.simulator.app import SimulatorApp

ARTIFACTS = Path(os.environ.get("COLLAB_TEST_ARTIFACTS", ROOT / ".cache" / "test-artifacts"))
AXE = Path(__file__).resolve().parent / "vendor" / "axe.min.js"
PASSWORD = "browser-pw-123"

# The model's speed: 750 tokens/s (a fast provider's), "+slow" a tenth of it. Each
# assistant's max_tokens cuts the simulator's reply (SIM_TOKENS): @a and @b write 300
# tokens (0.4 s), @slow 600 (8 s: long enough to stop, reload or restart mid-reply),
# @long1 and @long2 6,000 each (8 s side by side at 750 tokens/s: the smoothness test);
# @mute never sends a token (stop it).
SIM_TPS, SIM_TOKENS = 750.0, 6000
ASSISTANTS = [
    ("a", "sim", 300), ("b", "sim", 300), ("slow", "sim+slow", 600),
    ("long1", "sim", 6000), ("long2", "sim", 6000), ("mute", "sim+stall@0", 100),
]  # fmt: skip

# alice owns room "lab"; bob and carol are members (carol: the rate-limit test's, so
# that her used-up posting rate slows nobody else down).
SETUP = f"""
from django.contrib.auth.models import User
from collab.chat.services import providers
from collab.chat.services import rooms
from collab.chat.models import Assistant, Membership
alice = User.objects.create_user("alice", password="{PASSWORD}")
room = rooms.create_room(alice, "Lab", topic="in a real browser")
for name in ("bob", "carol"):
    Membership.objects.create(room=room, user=User.objects.create_user(name, password="{PASSWORD}"))
provider = providers.ensure_default_assistant().provider
for h, model, tokens in {ASSISTANTS!r}:
    room.assistants.add(
        Assistant.objects.create(handle=h, display_name=h.upper(), provider=provider, model=model, max_tokens=tokens,
                                 available_to="everyone")
    )
"""


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
    """A Daphne process on a SQLite file of its own, with alice (owner), bob and carol in
    room lab. It keeps its port when stopped and started again (a restart mid-reply)."""

    url: str
    env: dict[str, str]
    port: int
    server: Daphne | None = None
    cookies: dict[str, str] = field(default_factory=dict)

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.server.proc if self.server is not None else None

    def start(self) -> None:
        self.server = start_daphne(self.env, self.port)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def cookie(self, username: str) -> str:
        if username not in self.cookies:
            self.cookies[username] = login(self.url, username, PASSWORD)
        return self.cookies[username]

    def shell(self, code: str) -> str:
        return manage(self.env, "shell", "-c", code)


@pytest.fixture(scope="module")
def sim_app() -> Iterator[tuple[str, SimulatorApp]]:
    """The site's simulated model: its URL, and the app whose `recorded` holds every
    request it got (what a test reads of what an assistant was sent)."""
    from collab.simulator.testing import running_simulator_app

    with running_simulator_app(tps=SIM_TPS, ttft_ms=30, reply_tokens=SIM_TOKENS, seed=2) as (url, app):
        yield url, app


@pytest.fixture(scope="module")
def browser_sim(sim_app: tuple[str, SimulatorApp]) -> str:
    return sim_app[0]


@pytest.fixture(scope="module")
def site(browser_sim: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    with running_site(browser_sim, tmp_path_factory) as site:
        yield site


@contextmanager
def running_site(browser_sim: str, tmp_path_factory: pytest.TempPathFactory, **settings: str) -> Iterator[Site]:
    """The site (class Site) on these more environment variables, for the block."""
    env = {
        **os.environ,
        "COLLAB_LLM_BASE_URL": browser_sim,
        "COLLAB_LLM_MODEL": "sim",
        "DJANGO_SETTINGS_MODULE": "collab.settings",
        "COLLAB_SQLITE_PATH": str(tmp_path_factory.mktemp("browser") / "site.sqlite3"),
        "COLLAB_REDIS_PREFIX": f"browser{uuid.uuid4().hex[:8]}:",
        **settings,
    }
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    migrate(env)
    port = free_port()
    site = Site(f"http://127.0.0.1:{port}", env, port)
    site.shell(SETUP)
    site.start()
    try:
        yield site
    finally:
        site.stop()


# Per module, not per session: Playwright's sync API keeps an event loop running in the
# main thread while it is open, and every async test after it would fail to start its own.
@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    path = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield browser
        browser.close()


def open_page(chromium: Any, site: Site, username: str | None, path: str, **context_options: Any) -> Any:
    """A new browser context (logged in as `username`, unless None) on `path`."""
    context = chromium.new_context(**context_options)
    if username is not None:
        host = site.url.split("//", 1)[1].split(":")[0]
        context.add_cookies([{"name": "sessionid", "value": site.cookie(username), "domain": host, "path": "/"}])
    page = context.new_page()
    page.goto(f"{site.url}{path}")
    return page


def open_room(chromium: Any, site: Site, username: str, **context_options: Any) -> Any:
    """A new browser context logged in as `username`, on the room page, its socket live."""
    page = open_page(chromium, site, username, "/r/lab/", **context_options)
    page.wait_for_selector("#conn.ok")
    return page


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def send(page: Any, text: str) -> None:
    """Type `text` into the message box and press Enter, as a person would send it."""
    box = page.locator("#composer textarea")
    box.fill(text)
    box.press("Enter")


def finished(page: Any, count: int, timeout: float = 30_000) -> None:
    """Wait until the page shows at least `count` assistant replies that have ended."""
    page.wait_for_function(
        "n => document.querySelectorAll('article[data-role=assistant]:not([data-status=streaming])').length >= n",
        arg=count,
        timeout=timeout,
    )


def streaming_article(page: Any, min_chars: int = 20) -> Any:
    """The newest assistant article, once it shows at least `min_chars` of streamed text."""
    page.wait_for_function(
        """n => { const a = [...document.querySelectorAll('article[data-role=assistant][data-status=streaming]')].pop();
                  return a && a.querySelector('.body').textContent.length >= n; }""",
        arg=min_chars,
    )
    return page.locator("article[data-role=assistant][data-status=streaming]").last


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """axe-core's violations on the page as it is (every rule axe runs by default), each
    with its id, impact and the first few elements it names."""
    page.add_script_tag(path=str(AXE))
    result: list[dict[str, Any]] = page.evaluate(
        """async () => {
            const r = await axe.run(document, {resultTypes: ['violations']});
            return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                nodes: v.nodes.slice(0, 5).map(n => n.target.join(' ') + ' :: ' + n.failureSummary)}));
        }"""
    )
    return result
