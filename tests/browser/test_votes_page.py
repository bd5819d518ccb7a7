"""Votes in a real browser (docs/wire.md, "vote"): the Up and Down buttons of a reply
update its counts on every member's page (the article's data-votes-up/down and
data-verdict), the viewer's own vote shows pressed (and nobody else's page presses it),
voters' names show on hover or focus, and a rejected reply folds away and reopens."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import axe_violations, finished, open_room, screenshot, send

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(120)]


def test_votes_update_every_page_press_the_voters_own_and_fold_a_rejected_reply(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    bob = open_room(chromium, site, "bob")
    send(alice, "@a @b which colour for the logo?")
    finished(alice, 2)
    finished(bob, 2)
    replies = alice.locator("article[data-role=assistant]")
    first, second = (replies.nth(replies.count() - 2), replies.last)
    one, two = (first.get_attribute("id"), second.get_attribute("id"))
    assert first.get_attribute("data-votes-up") == "0"

    bob.locator(f"#{one}-votes .act.vote.up").click()
    for page in (alice, bob):
        page.wait_for_selector(f"#{one}[data-votes-up='1'][data-votes-down='0'][data-verdict=approved]")
    assert bob.locator(f"#{one}-votes .act.vote.up").get_attribute("aria-pressed") == "true"
    assert bob.locator(f"#{one}-votes .act.vote.none").is_visible()  # his own vote: he may take it back
    assert alice.locator(f"#{one}-votes .act.vote.up").get_attribute("aria-pressed") == "false"
    assert not alice.locator(f"#{one}-votes .act.vote.none").is_visible()
    assert alice.locator(f"#{one}-votes .voters").get_attribute("title") == "up: bob"

    alice.locator(f"#{two}-votes .act.vote.down").click()
    for page in (alice, bob):
        page.wait_for_selector(f"#{two}[data-verdict=rejected]")
    body = bob.locator(f"#{two} .body")
    assert not body.is_visible()  # folded away
    reopen = bob.locator(f"#{two}-votes button.reopen")
    assert reopen.get_attribute("aria-expanded") == "false"
    reopen.click()
    assert body.is_visible() and reopen.get_attribute("aria-expanded") == "true"
    screenshot(bob, "votes-rejected-reopened")

    alice.locator(f"#{two}-votes .act.vote.none").click()  # taken back: no verdict, shown again
    for page in (alice, bob):
        page.wait_for_selector(f"#{two}[data-votes-down='0']:not([data-verdict])")
    assert alice.locator(f"#{two} .body").is_visible()
    assert [v for v in axe_violations(alice) if v["impact"] in ("serious", "critical")] == []
    assert alice.locator("#errors .error").count() == 0
