"""Accessibility in a real browser: axe-core finds nothing on the room, the rooms list,
the login page and the room settings page, in the light and the dark theme; the room
works from the keyboard alone; a screen reader hears a reply start and end, not every
piece of it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import axe_violations, finished, open_page, open_room, screenshot, send, streaming_article

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(180)]

PAGES = [
    ("room", "alice", "/r/lab/"),
    ("rooms", "alice", "/"),
    ("login", None, "/accounts/login/"),
    ("settings", "alice", "/r/lab/settings/"),
]


@pytest.fixture(scope="module")
def room_with_replies(chromium: Any, site: Any) -> None:
    """The room with what axe should look at: a user message with code and a link, and
    two finished replies (Markdown, highlighted code)."""
    page = open_room(chromium, site, "alice")
    send(
        page, "Look at `this` and [the docs](https://example.com):\n\n```python\ndef f(x):\n    return 'hi'  # ok\n```"
    )
    send(page, "@a @b explain it, with code")
    finished(page, 2)
    page.context.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize(("name", "username", "path"), PAGES, ids=[p[0] for p in PAGES])
def test_axe_finds_no_violations(
    chromium: Any, site: Any, room_with_replies: None, scheme: str, name: str, username: str | None, path: str
) -> None:
    page = open_page(chromium, site, username, path, color_scheme=scheme)
    if name == "room":
        page.wait_for_selector("#conn.ok")
        page.wait_for_selector("article[data-role=assistant] pre")
    violations = axe_violations(page)
    screenshot(page, f"axe-{name}-{scheme}")
    assert violations == [], "\n".join(
        f"{v['id']} ({v['impact']}): {v['help']}\n  " + "\n  ".join(v["nodes"]) for v in violations
    )


def test_axe_while_a_reply_streams_and_on_a_phone(chromium: Any, site: Any) -> None:
    page = open_room(chromium, site, "bob", viewport={"width": 390, "height": 740}, is_mobile=True, color_scheme="dark")
    send(page, "@slow take your time")
    streaming_article(page, 40)
    page.get_by_role("button", name="Members").click()
    violations = axe_violations(page)
    assert violations == [], violations
    page.get_by_role("button", name="Stop").last.click()


# Records what the page's live regions say, and whether the message list itself is one.
WATCH_ANNOUNCEMENTS = """() => {
  window.__said = [];
  const region = document.getElementById('announcer');
  new MutationObserver(() => { const t = region.textContent.trim(); if (t) window.__said.push(t); })
    .observe(region, {childList: true, subtree: true, characterData: true});
  window.__busy = new Set();
  new MutationObserver(() => {
    document.querySelectorAll('article[aria-busy=true]').forEach(a => window.__busy.add(a.id));
  }).observe(document.getElementById('messages').parentNode, {childList: true, subtree: true});
}"""


def test_a_reply_is_announced_when_it_starts_and_when_it_ends(chromium: Any, site: Any) -> None:
    bob = open_room(chromium, site, "bob")
    live_ids = ("announcer", "errors", "conn", "composer-file-status")  # the last: files.js, on the box's files
    for live in bob.locator("[aria-live]").all():
        assert live.get_attribute("id") in live_ids, live.get_attribute("id")
    assert bob.locator("#messages[aria-live], #messages [aria-live]").count() == 0
    bob.evaluate(WATCH_ANNOUNCEMENTS)
    send(bob, "@a @b one more time")
    finished(bob, 2 + bob.locator("article[data-role=assistant]:not([data-status=streaming])").count())
    bob.wait_for_function("() => (window.__said.join(' ').match(/finished/g) || []).length >= 2")
    said = bob.evaluate("window.__said")
    print("announced:", said)
    for name in ("A", "B"):
        assert len([t for t in said if f"{name} is replying" in t]) == 1, said
        assert len([t for t in said if f"{name} finished" in t]) == 1, said
    assert len(said) <= 4, said  # nothing per piece
    busy = bob.evaluate("[...window.__busy]")
    assert len(busy) == 2, busy  # each reply was aria-busy while it streamed
    assert bob.locator("article[aria-busy=true]").count() == 0  # and is no more


def test_keyboard_only(chromium: Any, site: Any) -> None:
    """From the top of the page with Tab, Enter and Escape only: write a message with a
    completed @handle, send it, stop its reply, open the member list."""
    page = open_room(chromium, site, "alice", viewport={"width": 390, "height": 740}, is_mobile=True)

    def focused() -> dict[str, str]:
        return dict(
            page.evaluate(
                "() => { const e = document.activeElement; return {tag: e.tagName, name: e.getAttribute('aria-label') || e.textContent.trim(), id: e.id}; }"
            )
        )

    def tab_to(predicate: Any, key: str = "Tab") -> dict[str, str]:
        for _ in range(60):
            page.keyboard.press(key)
            now = focused()
            if predicate(now):
                return now
        raise AssertionError(f"never reached by {key}; last: {focused()}")

    # The first stop is the skip link, past every message's controls to the box.
    assert tab_to(lambda f: True)["name"] == "Skip to the message box"
    page.keyboard.press("Enter")
    assert focused()["tag"] == "TEXTAREA"
    page.keyboard.type("@sl")
    page.keyboard.press("Enter")  # picks @slow
    page.keyboard.type("from the keyboard")
    page.keyboard.press("Enter")
    article_id = streaming_article(page, 20).get_attribute(
        "id"
    )  # now: once stopped, no locator of a streaming article finds it
    stop = tab_to(lambda f: f["name"] == "Stop", "Shift+Tab")  # back up from the box to the reply
    assert stop["tag"] == "BUTTON"
    outline = page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none"  # the focus is visible
    page.keyboard.press("Enter")
    page.wait_for_selector(f"#{article_id}[data-status=stopped]")
    tab_to(lambda f: f["name"].startswith("Members"))
    page.keyboard.press("Enter")
    assert page.locator("#members").is_visible()
    screenshot(page, "keyboard-members")
