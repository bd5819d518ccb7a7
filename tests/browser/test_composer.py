"""The message box in a real browser: what is sent stays until the server has it,
refusals are shown, line breaks are kept, @handles complete, and the limit is counted."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import open_room, screenshot, send

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(120)]

LIMIT = 8000  # COLLAB_MAX_MESSAGE_CHARS, the default

BOX = "#composer textarea"


def test_a_message_over_the_limit_stays_in_the_box(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    box = alice.locator(BOX)
    counter = alice.locator("#counter")
    box.fill("x" * (LIMIT - 1000))
    assert not counter.is_visible()  # far from the limit: no counter
    too_long = "word " * (LIMIT // 5) + "and more"  # a long paste: nothing cut from it
    box.fill(too_long)
    assert box.input_value() == too_long
    assert counter.is_visible()
    assert f"{len(too_long):,}" in counter.inner_text() and f"{LIMIT:,}" in counter.inner_text()
    box.press("Enter")
    error = alice.locator("#errors .error[data-code='message.too_long']")
    error.wait_for()
    assert f"{LIMIT:,}" in error.inner_text()
    assert box.input_value() == too_long  # still there, to be shortened
    assert box.get_attribute("aria-invalid") == "true"
    screenshot(alice, "composer-too-long")
    # Shortened to the limit, it goes: the box empties once the message is in the room.
    box.fill("y" * LIMIT)
    box.press("Enter")
    alice.wait_for_function(
        "n => [...document.querySelectorAll('article[data-role=user]')].some(a => a.textContent.includes('y'.repeat(n)))",
        arg=LIMIT,
    )
    alice.wait_for_function(f"() => document.querySelector('{BOX}').value === ''")
    assert not counter.is_visible()


def test_a_rate_limited_message_stays_in_the_box(chromium: Any, site: Any) -> None:
    """carol sends until the server refuses one (rate.limited: a burst of 8, then one per
    1.5 s): each accepted message left the box, the refused one is still in it, with its
    error; sent again once the rate allows, it is posted once."""
    carol = open_room(chromium, site, "carol")
    box = carol.locator(BOX)
    refused = None
    for i in range(40):
        text = f"message number {i} from carol"
        send(carol, text)
        carol.wait_for_function(
            """t => document.querySelector('#errors .error[data-code="rate.limited"]')
                   || [...document.querySelectorAll('article[data-role=user]')].some(a => a.textContent.includes(t))""",
            arg=text,
        )
        if carol.locator("#errors .error[data-code='rate.limited']").count():
            refused = text
            break
        carol.wait_for_function(f"() => document.querySelector('{BOX}').value === ''")  # accepted: cleared
    assert refused is not None, "never rate-limited"
    assert box.input_value() == refused
    assert carol.locator("#errors .error[data-code='rate.limited']").is_visible()
    screenshot(carol, "composer-rate-limited")
    # Pressing Enter again (the rate refills: one message per 1.5 s) posts it, once.
    carol.locator("#errors .error").first.wait_for(state="detached", timeout=15_000)  # it faded by itself
    for _ in range(20):
        box.press("Enter")
        carol.wait_for_function(
            """t => document.querySelector('#errors .error[data-code="rate.limited"]')
                   || document.querySelector('#composer textarea').value === ''""",
            arg=refused,
        )
        if box.input_value() == "":
            break
        carol.locator("#errors .error").first.wait_for(state="detached", timeout=15_000)
    assert box.input_value() == ""
    posted = carol.evaluate(
        "t => [...document.querySelectorAll('article[data-role=user]')].filter(a => a.textContent.includes(t)).length",
        refused,
    )
    assert posted == 1


def test_line_breaks_are_kept(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    box = alice.locator(BOX)
    box.click()
    alice.keyboard.type("first line")
    alice.keyboard.press("Shift+Enter")
    alice.keyboard.type("second line")
    alice.keyboard.press("Shift+Enter")
    alice.keyboard.type("third line")
    assert box.input_value() == "first line\nsecond line\nthird line"  # Shift+Enter did not send
    alice.keyboard.press("Enter")
    article = alice.locator("article[data-role=user]", has_text="third line").last
    article.wait_for()
    assert article.locator(".body br").count() == 2
    assert article.locator(".body").inner_text().strip().splitlines() == ["first line", "second line", "third line"]


def test_at_completes_assistant_handles(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    box = alice.locator(BOX)
    box.click()
    alice.keyboard.type("hello @sl")
    options = alice.get_by_role("option")
    assert [o.inner_text().split()[0] for o in options.all()] == ["@slow"]
    alice.keyboard.press("Tab")
    assert box.input_value() == "hello @slow "
    assert alice.get_by_role("listbox").count() == 0  # closed
    alice.keyboard.type("and @")
    handles = [o.inner_text().split()[0] for o in alice.get_by_role("option").all()]
    assert handles == ["@a", "@assistant", "@b", "@long1", "@long2", "@mute", "@slow", "@all"]
    alice.keyboard.press("ArrowDown")
    alice.keyboard.press("ArrowDown")  # the third: @b
    alice.keyboard.press("Enter")  # picks it; does not send
    assert box.input_value() == "hello @slow and @b "
    alice.keyboard.type("x")
    alice.keyboard.press("Escape")
    alice.keyboard.type("?")
    assert box.input_value() == "hello @slow and @b x?"
    alice.keyboard.press("Enter")  # now it sends
    alice.locator("article[data-role=user]", has_text="hello @slow and @b x?").wait_for()
