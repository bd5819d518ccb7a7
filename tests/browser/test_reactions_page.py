"""Reactions, avatars and the assistant's card in a real browser (docs/wire.md, "react"):
two members in two browser contexts; one reacts from the picker, the other sees the count
live and, hovering, who gave it; the picker finds an emoji by its name and works from the
keyboard; each member's own reaction shows pressed on their page alone; avatars beside
every message and member; an assistant's name opens its card with the model that
answered; axe-core finds nothing, the picker open or closed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import axe_violations, finished, open_room, screenshot, send

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(120)]


def count_is(page: Any, bar: str, emoji: str, n: int) -> None:
    """Wait until the bar `#bar` shows `n` for `emoji` (0: no button for it)."""
    page.wait_for_function(
        """([bar, emoji, n]) => {
          const b = [...document.querySelectorAll('#' + bar + ' .reaction')].find(x => x.dataset.emoji === emoji);
          return n === 0 ? !b : !!b && b.querySelector('.n').textContent === String(n);
        }""",
        arg=[bar, emoji, n],
    )


def test_a_reaction_shows_live_with_who_gave_it_and_the_picker_finds_by_name(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    bob = open_room(chromium, site, "bob")
    send(alice, "@a what shall we call the release?")
    finished(alice, 1)
    finished(bob, 1)
    question = alice.locator("article[data-role=user]").last.get_attribute("id")
    reply = alice.locator("article[data-role=assistant]").last.get_attribute("id")

    # Bob reacts from the picker's quick set; Alice sees it at once, and who, on hover.
    add = bob.locator(f"#{question}-reactions .react-add")
    add.click()
    assert bob.locator("#reaction-picker").is_visible() and add.get_attribute("aria-expanded") == "true"
    assert bob.evaluate("document.activeElement.id") == "reaction-search"
    bob.locator("#reaction-picker .pick[data-emoji='👍']").click()
    assert not bob.locator("#reaction-picker").is_visible()
    for page in (alice, bob):
        count_is(page, f"{question}-reactions", "👍", 1)
    thumbs = f"#{question}-reactions .reaction[data-emoji='👍']"
    assert bob.locator(thumbs).get_attribute("aria-pressed") == "true"  # his own
    assert alice.locator(thumbs).get_attribute("aria-pressed") == "false"
    tip = alice.locator(f"#{question}-reactions .who").first
    assert not tip.is_visible()
    alice.locator(thumbs).hover()
    assert tip.is_visible() and tip.inner_text() == "thumbs up: bob"
    alice.locator(thumbs).click()  # she gives the same: 2, both names
    for page in (alice, bob):
        count_is(page, f"{question}-reactions", "👍", 2)
    assert "bob and alice" in bob.locator(f"#{question}-reactions .who").first.inner_text()
    assert alice.locator(thumbs).get_attribute("aria-pressed") == "true"

    # Alice finds an emoji by its name, from the keyboard alone, on the reply.
    alice.locator(f"#{reply}-reactions .react-add").focus()
    alice.keyboard.press("Enter")
    alice.keyboard.type("rocket")
    alice.wait_for_selector("#reaction-grid .pick[data-emoji='🚀']")
    alice.keyboard.press("ArrowDown")
    assert alice.evaluate("document.activeElement.dataset.emoji") == "🚀"
    alice.keyboard.press("Enter")
    count_is(bob, f"{reply}-reactions", "🚀", 1)
    assert "rocket: alice" in bob.locator(f"#{reply}-reactions .who").first.text_content()
    alice.wait_for_function(f"document.activeElement.closest('#{reply}-reactions') !== null")  # back on its bar
    alice.locator(f"#{reply}-reactions .react-add").click()
    alice.locator("#reaction-search").fill("no such emoji anywhere")
    alice.wait_for_selector("#reaction-picker .reaction-none:not([hidden])")
    alice.keyboard.press("Escape")
    assert not alice.locator("#reaction-picker").is_visible()

    # Avatars beside every message and member; the assistant's card names its model.
    for page in (alice, bob):
        articles = page.locator("#messages article").count()
        assert page.locator("#messages article header .avatar").count() == articles
        assert page.locator("#members li[data-user] .avatar").count() == page.locator("#members li[data-user]").count()
    mine = alice.locator(f"#{question} header .avatar")
    assert mine.get_attribute("data-initials") == "A"
    assert bob.locator(f"#{question} header .avatar").get_attribute("style") == mine.get_attribute("style")
    assert alice.locator(f"#{question} header .author").inner_text() == "alice"  # the initials are not text
    card = bob.locator(f"#{reply} .about-card")
    assert not card.is_visible()
    bob.locator(f"#{reply} summary.author").click()
    assert card.is_visible()
    assert card.locator("dd code").inner_text() == "@a" and card.locator("dd.model").inner_text() == "sim"
    assert "default" in card.inner_text()
    screenshot(bob, "reactions-and-card")

    alice.locator(f"#{question}-reactions .react-add").click()  # axe with the picker open, then closed
    assert alice.locator("#reaction-search").input_value() == ""  # a fresh search each time
    alice.wait_for_function("document.querySelectorAll('#reaction-grid .pick').length > 100")  # the whole set
    screenshot(alice, "reaction-picker")
    for page in (alice, bob):
        assert [v for v in axe_violations(page) if v["impact"] in ("serious", "critical")] == []
    alice.keyboard.press("Escape")
    # (A model's reply may start at <h3>: axe's "heading-order", moderate, is the reply's, not the page's.)
    assert [v for v in axe_violations(alice) if v["id"] != "heading-order"] == []
    assert alice.locator("#errors .error").count() == 0 and bob.locator("#errors .error").count() == 0
