"""Typing in a real browser (docs/wire.md, "typing"): a member who types is shown to the
others as "NAME is typing…", never to themselves; the notice clears when their message
arrives, or by itself 4 s after the last one."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.browser.conftest import open_room

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(120)]

BOX = "#composer textarea"
BOB_TYPING = "#typing .typing-who[data-user='bob']"


def test_typing_shows_to_the_others_and_clears_when_the_message_arrives(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    bob = open_room(chromium, site, "bob")
    bob.locator(BOX).press_sequentially("hello every")
    notice = alice.locator(BOB_TYPING)
    notice.wait_for()
    assert notice.inner_text() == "bob is typing…"
    assert bob.locator("#typing .typing-who").count() == 0  # not to the typer
    bob.locator(BOX).press_sequentially("one, typed on")
    bob.locator(BOX).press("Enter")
    alice.wait_for_function(
        "() => [...document.querySelectorAll('article[data-role=user]')].some(a => a.textContent.includes('typed on'))"
    )
    assert alice.locator(BOB_TYPING).count() == 0  # cleared with the message, not by its timer
    assert alice.locator("#typing .typing-who").count() == 0


def test_the_page_sends_typing_at_most_once_every_2_s(chromium: Any, site: Any) -> None:
    bob = open_room(chromium, site, "bob")
    sent: list[float] = []
    bob.on(
        "websocket",
        lambda ws: ws.on("framesent", lambda payload: sent.append(time.monotonic()) if '"typing"' in payload else None),
    )
    bob.reload()  # the socket again, now watched
    bob.wait_for_selector("#conn.ok")
    started = time.monotonic()
    bob.locator(BOX).press_sequentially("a fairly long sentence, typed one key at a time")
    elapsed = time.monotonic() - started
    bob.locator(BOX).press_sequentially("!")
    assert sent, "typing was never sent"
    assert len(sent) <= 2 + elapsed / 2  # one at once, then at most one per 2 s (48 keys were typed)


def test_a_notice_clears_by_itself(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    carol = open_room(chromium, site, "carol")
    # When the notice was put in the page, noted by the page itself (not when the test saw it).
    alice.evaluate(
        """() => new MutationObserver((changes, observer) => {
            if (document.querySelector("#typing .typing-who[data-user='carol']")) {
                window.noticeAt = performance.now();
                observer.disconnect();
            }
        }).observe(document.getElementById("typing"), { childList: true })"""
    )
    carol.locator(BOX).press_sequentially("never sent")
    notice = alice.locator("#typing .typing-who[data-user='carol']")
    notice.wait_for()
    notice.wait_for(state="detached", timeout=15_000)
    shown = alice.evaluate("() => performance.now() - window.noticeAt")
    assert shown >= 3_900  # its own 4 s timer, not something else (the test sees the removal late, never early)
