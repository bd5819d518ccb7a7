"""The admin's live page with two real Daphnes on one Redis and one PostgreSQL: the page
served by one process shows the sockets and the reply of the other, its stop button
reaches that reply, a process killed drops out by itself; and in Debian's Chromium the
page refreshes itself without reloading (tests/test_admin_live.py: the page in one process).
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import re
import signal
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from collab.chat.shared.base import STATUS_TTL_S
from collab.simulator.testing import running_simulator_app
from tests.cluster import PASSWORD, Browser, Cluster, Process, postgres_cluster
from tests.test_admin_live import FRAGMENT, LIVE, Fragment
from tests.test_multiprocess import opened, streaming_with_text


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[str]:
    """@long streams 3,000 tokens at 150 tokens/s: for 20 s, unless stopped."""
    with running_simulator_app(tps=150.0, ttft_ms=20, reply_tokens=3000, seed=5) as (url, _app):
        yield url


@pytest.fixture
def cluster(slow_sim: str) -> Iterator[Cluster]:
    """As tests/test_multiprocess.py's, with a staff member (root)."""
    root = f"User.objects.create_superuser('root', password={PASSWORD!r})"
    with postgres_cluster(slow_sim, "live", setup=root) as cluster:
        yield cluster


class Staff:
    """A staff member's browser on the admin (a session cookie valid on every process)."""

    def __init__(self, cookie: str) -> None:
        self.cookie = cookie

    def get(self, process: Process, path: str) -> tuple[int, str]:
        """(status, page), redirects not followed (a non-staff user's is to the login)."""

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any, **kwargs: Any) -> None:
                return None

        request = urllib.request.Request(process.url + path, headers={"Cookie": f"sessionid={self.cookie}"})
        try:
            with urllib.request.build_opener(NoRedirect).open(request, timeout=10) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), ""

    def post(self, process: Process, path: str) -> int:
        """A button of the page served by `process`: its CSRF token, then the POST (htmx)."""
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        headers = {"Cookie": f"sessionid={self.cookie}"}
        page = opener.open(urllib.request.Request(process.url + LIVE, headers=headers)).read().decode()
        token = re.search(r'"X-CSRFToken": "([^"]+)"', page)
        assert token is not None
        csrf = next(c.value for c in jar if c.name == "csrftoken")
        body = urllib.parse.urlencode({"csrfmiddlewaretoken": token.group(1)}).encode()
        headers = {"Cookie": f"sessionid={self.cookie}; csrftoken={csrf}", "HX-Request": "true"}
        with opener.open(urllib.request.Request(process.url + path, data=body, headers=headers)) as response:
            return int(response.status)

    async def fragment_until(self, process: Process, done: Callable[[Fragment], bool], timeout: float = 20) -> Fragment:
        async with asyncio.timeout(timeout):
            while True:
                status, html = await asyncio.to_thread(self.get, process, FRAGMENT)
                assert status == 200
                page = Fragment(html)
                if done(page):
                    return page
                await asyncio.sleep(0.1)  # the next poll


def process_id(page: Fragment, pid: int) -> str:
    return next(p for p, row in page.processes.items() if row.get("here") == "0" and p.split(":")[1] == str(pid))


@pytest.mark.e2e
@pytest.mark.redis
@pytest.mark.postgres
@pytest.mark.timeout(180)
async def test_the_page_on_one_process_shows_the_other_and_drops_it_once_killed(cluster: Cluster) -> None:
    p1, p2 = cluster.start("P1"), cluster.start("P2")
    alice, bob = await Browser.login(p2, "alice"), await Browser.login(p2, "bob")
    admin = Staff((await Browser.login(p1, "root")).cookie)
    assert admin.get(p1, FRAGMENT)[0] == 200 and Staff(alice.cookie).get(p1, FRAGMENT) == (302, "")  # staff only
    async with alice.open(p2) as a_ws, alice.open(p2) as a2_ws, bob.open(p2) as b_ws:
        a, _, b = await opened(a_ws, a2_ws, b_ws)
        await a.post("@long tell me everything")  # posted on P2: the reply runs on P2
        await b.until(lambda t: streaming_with_text(t, 100))

        def shows_p2(page: Fragment) -> bool:
            streaming = any(float(r["tps"]) > 0 for r in page.replies.values())
            return page.rooms.get("lab", {}).get("sockets") == "3" and streaming

        page = await admin.fragment_until(p1, shows_p2)
        other = process_id(page, p2.proc.pid)
        assert page.room_sockets["lab"] == {other: 3}
        assert (page.rooms["lab"]["users"], page.rooms["lab"]["streaming"]) == ("alice bob", "1")
        ((reply_id, reply),) = page.replies.items()
        assert (reply["process"], reply["assistant"]) == (other, "long")
        assert (reply["provider"], reply["model"]) == ("default", "sim")
        assert float(reply["elapsed"]) > 0 and int(reply["tokens"]) > 1
        assert (page.processes[other]["sockets"], page.processes[other]["replies"]) == ("3", "1")
        assert float(page.processes[other]["age"]) < STATUS_TTL_S
        assert page.processes[next(p for p, r in page.processes.items() if r["here"] == "1")]["sockets"] == "0"

        assert await asyncio.to_thread(admin.post, p1, f"{LIVE}stop/{reply_id}/") == 200  # asked on P1
        await b.until(lambda t: bool(t.assistant_replies()[reply_id].final_attrs))
        assert b.assistant_replies()[reply_id].final_attrs["data-status"] == "stopped"
        stored = cluster.replies()[reply_id]
        assert stored["status"] == "stopped" and stored["text"].startswith(b.assistant_replies()[reply_id].text[:100])
        await admin.fragment_until(p1, lambda p: reply_id not in p.replies)

        p2.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        # its last status expires a TTL after its last beat: no need to wait much longer
        page = await admin.fragment_until(p1, lambda p: other not in p.processes, timeout=2 * STATUS_TTL_S)
        print(f"kill -9: the process left the live page {time.monotonic() - killed:.1f} s after the kill")
    assert "lab" not in page.rooms or page.rooms["lab"]["sockets"] == "0"
    code = "from collab.chat.models import AuditEntry as A; print(list(A.objects.values_list('action', 'actor_name')))"
    assert cluster.manage("shell", "-c", code).strip().splitlines()[-1] == "[('stop_reply', 'root')]"


@pytest.mark.e2e
@pytest.mark.redis
@pytest.mark.postgres
@pytest.mark.browser
@pytest.mark.timeout(180)
def test_in_a_browser_the_page_refreshes_itself_and_its_stop_button_works(cluster: Cluster) -> None:
    """Debian's Chromium (tests/browser): the page served by P1 follows a reply running on
    P2 without reloading, and its stop button stops it."""
    from playwright.sync_api import sync_playwright

    from tests.browser.conftest import chromium_path, screenshot
    from tests.servers import login

    path = chromium_path()
    p1, p2 = cluster.start("P1"), cluster.start("P2")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:

            def page_as(username: str, process: Process, url: str) -> Any:
                context = browser.new_context(viewport={"width": 1400, "height": 900})
                cookie = login(process.url, username, PASSWORD)
                context.add_cookies([{"name": "sessionid", "value": cookie, "domain": "127.0.0.1", "path": "/"}])
                page = context.new_page()
                page.goto(process.url + url)
                return page

            admin = page_as("root", p1, LIVE)
            admin.evaluate("window.__loaded = 'once'")  # gone if the page reloads
            alice = page_as("alice", p2, "/r/lab/")
            alice.wait_for_selector("#conn.ok")
            alice.locator("#composer textarea").fill("@long tell me everything")
            alice.locator("#composer textarea").press("Enter")
            row = "#live tr[data-reply][data-state=writing]"
            admin.wait_for_selector(row, timeout=15_000)
            tokens = int(admin.locator(row).get_attribute("data-tokens") or 0)
            admin.wait_for_function(  # the next poll brings more tokens
                "n => Number(document.querySelector('#live tr[data-reply]')?.dataset.tokens) > n", arg=tokens
            )
            assert admin.evaluate("window.__loaded") == "once"
            assert admin.locator(row).get_attribute("data-process") != admin.locator("tr[data-here='1']").get_attribute(
                "data-process"
            )  # the reply runs on P2; the page is P1's
            screenshot(admin, "admin-live")
            reply_id = admin.locator(row).get_attribute("data-reply")
            admin.locator(f"button[data-action=stop][data-reply='{reply_id}']").click()
            admin.wait_for_selector("#live [data-notice=ok]")
            alice.wait_for_selector(f"#msg-{reply_id}[data-status=stopped]", timeout=15_000)
            admin.wait_for_selector("#live tr[data-reply]", state="detached")
            assert admin.evaluate("window.__loaded") == "once"
        finally:
            browser.close()
