"""Unread and notifications in Chromium, on two real Daphne processes (one Redis, one
PostgreSQL): alice writes on one, bob reads on the other. The sidebar's counts and
mention marks live across rooms, contexts and processes; opening a room reads it; a
phone's menu; a notification through a granted permission while bob's tab is hidden,
and the tab's title counting what he has not read; his "never" silences it; a mention in
another of his rooms reaches his hidden tab through its sidebar.
(docs/wire.md, "mark read", "notifications", "My rooms")"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.conftest import axe_violations, screenshot, send
from tests.cluster import PASSWORD, Cluster, Process, postgres_cluster
from tests.servers import login

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(240)]

OTHER = """
other = rooms.create_room(alice, "Other", topic="elsewhere")
Membership.objects.create(room=other, user=bob)
"""

# Before any script of the page: the tab's visibility under the test's control, and every
# `new Notification(...)` recorded (then made for real, as the page asked).
HIDDEN_AND_NOTES = """
(() => {
  let hidden = false;
  Object.defineProperty(Document.prototype, "visibilityState", {configurable: true, get() { return hidden ? "hidden" : "visible"; }});
  Object.defineProperty(Document.prototype, "hidden", {configurable: true, get() { return hidden; }});
  window.__setHidden = (h) => { hidden = h; document.dispatchEvent(new Event("visibilitychange")); };
  window.__notes = [];
  window.__asked = 0;
  const Real = window.Notification;
  function Recorded(title, options) {
    window.__notes.push({title: title, body: (options || {}).body || ""});
    try { return new Real(title, options); } catch (e) { return {close() {}}; }
  }
  Recorded.requestPermission = (...args) => { window.__asked++; return Real.requestPermission(...args); };
  Object.defineProperty(Recorded, "permission", {get: () => Real.permission});
  window.Notification = Recorded;
})();
"""


@pytest.fixture(scope="module")
def two(browser_sim: str) -> Iterator[tuple[Cluster, Process, Process, dict[str, int]]]:
    with postgres_cluster(browser_sim, "ub", OTHER) as cluster:
        p1, p2 = cluster.start("P1"), cluster.start("P2")
        code = "from collab.chat.models import Room; print(*[Room.objects.get(slug=s).pk for s in ('lab', 'other')])"
        lab, other = cluster.manage("shell", "-c", code).strip().splitlines()[-1].split()
        yield cluster, p1, p2, {"lab": int(lab), "other": int(other)}


def context_of(chromium: Any, process: Process, username: str, **options: Any) -> Any:
    context = chromium.new_context(**options)
    host = process.url.split("//", 1)[1].split(":")[0]  # one cookie for both processes (same host)
    cookie = login(process.url, username, PASSWORD)
    context.add_cookies([{"name": "sessionid", "value": cookie, "domain": host, "path": "/"}])
    return context


def room_page(context: Any, process: Process, slug: str) -> Any:
    page = context.new_page()
    page.goto(f"{process.url}/r/{slug}/")
    page.wait_for_selector("#conn.ok")
    return page


def read_seq(cluster: Cluster, username: str, slug: str) -> int:
    code = (
        "from collab.chat.models import Membership; "
        f"print(Membership.objects.get(user__username={username!r}, room__slug={slug!r}).read_seq)"
    )
    return int(cluster.manage("shell", "-c", code).strip().splitlines()[-1])


def test_unread_and_mentions_live_across_contexts_and_processes(chromium: Any, two: Any) -> None:
    cluster, p1, p2, ids = two
    lab = f"#nav-room-{ids['lab']}"
    alice, bob = context_of(chromium, p1, "alice"), context_of(chromium, p2, "bob")
    try:
        a = room_page(alice, p1, "lab")
        b = room_page(bob, p2, "other")  # bob is in another room, on the other process
        b.wait_for_selector(f"{lab}[data-unread='0']", state="attached")
        assert b.locator(f"{lab} .unread").count() == 0
        send(a, "plain news for the team")
        b.wait_for_selector(f"{lab}[data-unread='1'] .unread")
        assert b.locator(f"{lab} .unread").inner_text().startswith("1")
        assert b.locator(f"{lab} .mentioned").count() == 0
        send(a, "@bob can you check the deploy?")
        b.wait_for_selector(f"{lab}[data-unread='2'][data-mention='1'] .mentioned")
        assert b.locator(f"{lab} a").get_attribute("aria-current") is None
        screenshot(b, "unread-sidebar")
        assert axe_violations(b) == []

        b_lab = room_page(bob, p1, "lab")  # another tab of his opens Lab, on P1: read
        b_lab.wait_for_selector(f"{lab} a[aria-current='page']")
        b.wait_for_selector(f"{lab}[data-unread='0'][data-mention='']")  # live on P2, in his other tab
        assert b.locator(f"{lab} .unread").count() == 0
        assert read_seq(cluster, "bob", "lab") >= 2

        send(a, "and one more")  # Lab is open and visible in b_lab: it reads it at once
        b_lab.wait_for_selector("article[data-role=user]:has-text('and one more')")
        b.wait_for_function("s => document.querySelector(s).getAttribute('data-unread') === '0'", arg=lab, polling=100)
        b_lab.close()
        home = bob.new_page()  # "My rooms" shows the same counts, from the database
        send(a, "@bob while you were away")
        b.wait_for_selector(f"{lab}[data-unread='1'][data-mention='1']")
        home.goto(f"{p2.url}/")
        item = home.locator(f"li[data-room='{ids['lab']}']")
        assert item.get_attribute("data-unread") == "1"
        assert item.locator(".mentioned").count() == 1
    finally:
        alice.close()
        bob.close()


def test_the_sidebar_is_a_menu_on_a_phone(chromium: Any, two: Any) -> None:
    _, p1, _, ids = two
    phone = context_of(chromium, p1, "bob", viewport={"width": 390, "height": 740}, is_mobile=True)
    try:
        page = room_page(phone, p1, "other")
        toggle = page.get_by_role("button", name="Rooms")
        assert toggle.is_visible() and toggle.get_attribute("aria-expanded") == "false"
        assert not page.locator("#rooms-list").is_visible()
        toggle.click()
        assert toggle.get_attribute("aria-expanded") == "true"
        page.locator(f"#nav-room-{ids['lab']} a").wait_for(state="visible")
        screenshot(page, "unread-phone-menu")
        assert axe_violations(page) == []
    finally:
        phone.close()


def test_a_hidden_tab_is_notified_and_counts_in_its_title(chromium: Any, two: Any) -> None:
    cluster, p1, p2, ids = two
    alice = context_of(chromium, p1, "alice")
    bob = context_of(chromium, p2, "bob")
    bob.grant_permissions(["notifications"], origin=p2.url)
    bob.add_init_script(HIDDEN_AND_NOTES)
    try:
        a = room_page(alice, p1, "lab")
        b = room_page(bob, p2, "lab")
        b.locator(".notify-box summary").click()
        b.wait_for_selector("#notify-status:has-text('notifications are on')")
        assert b.evaluate("window.__asked") == 0  # never asked unprompted
        assert b.title() == "Lab · collab"

        b.evaluate("window.__setHidden(true)")
        send(b, "@long tell me a long story")  # his question: its reply will end while he is away
        b.wait_for_selector("article[data-role=assistant][data-status=streaming]")
        b.wait_for_function("document.title === '(1) Lab · collab'")  # the reply, counted when posted
        send(a, "@bob are you there?")
        b.wait_for_function("window.__notes.length >= 1")
        note = b.evaluate("window.__notes[0]")
        assert note["title"] == "alice mentioned you in Lab" and "are you there?" in note["body"]
        b.wait_for_function("document.title === '(2) Lab · collab'")

        b.wait_for_function("window.__notes.length >= 2", timeout=60_000)  # the reply to him ended
        note = b.evaluate("window.__notes[1]")
        assert note["title"] == "LONG answered you in Lab" and note["body"]
        send(a, "no mention here")  # "mentions" (his default): counted, not notified
        b.wait_for_function("document.title === '(3) Lab · collab'")
        assert b.evaluate("window.__notes.length") == 2

        b.evaluate("window.__setHidden(false)")  # back: read, and the title is the room's again
        b.wait_for_function("document.title === 'Lab · collab'")
        last = int(cluster.manage("shell", "-c", LAST).strip().splitlines()[-1])
        b.wait_for_function(f"document.querySelector('#nav-room-{ids['lab']}').dataset.unread === '0'")
        assert read_seq(cluster, "bob", "lab") == last

        b.locator("#notify input[value=none]").check()  # never: still counted, never notified
        b.wait_for_selector("#notify[data-level=none]")
        b.evaluate("window.__setHidden(true)")
        send(a, "@bob last call")
        b.wait_for_function("document.title === '(1) Lab · collab'")
        assert b.evaluate("window.__notes.length") == 2

        elsewhere = room_page(alice, p1, "other")  # a mention in another room of his: its level is "mentions"
        send(elsewhere, "@bob one for you in here")
        b.wait_for_function("window.__notes.length >= 3")
        assert b.evaluate("window.__notes[2].title") == "You were mentioned in Other"
    finally:
        alice.close()
        bob.close()


LAST = "from collab.chat.models import Room; print(Room.objects.get(slug='lab').last_seq)"
