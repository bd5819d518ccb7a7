"""A reply's versions in a real browser (docs/wire.md, "regenerate a reply" and "show a
version"): Regenerate replaces the reply where it stands with its version 2, "2 / 2",
on every member's page; "Previous version" shows version 1, its text, "1 / 2", on every
page, still one article in the same place."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import axe_violations, finished, open_room, send

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(120)]


def test_regenerate_keeps_versions_in_place_and_previous_shows_the_first_for_everyone(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    bob = open_room(chromium, site, "bob")
    send(alice, "@a which fruit for the party?")
    finished(alice, 1)
    finished(bob, 1)
    reply = alice.locator("article[data-role=assistant]").last
    slot = reply.get_attribute("id").removeprefix("msg-")  # type: ignore[union-attr]
    first_text = reply.locator(".body").inner_text()
    send(alice, "a note after the answer")
    note = alice.locator("#messages > article[data-role=user]").last
    note.get_by_text("a note after the answer").wait_for()
    after = note.get_attribute("id")
    # Another room prompt: the simulated model writes another text for the same question.
    site.shell("from collab.chat.models import Room; Room.objects.update(system_prompt='round two')")
    reply.locator(".act.regenerate").click()
    in_slot = f"#messages > article[data-slot='{slot}']"
    for page in (alice, bob):
        page.wait_for_selector(f"{in_slot}[data-version='2'][data-versions='2']:not([data-status=streaming])")
        assert page.locator(in_slot).count() == 1  # one article for the reply, not a second one
        assert page.locator(f"{in_slot} .version-count").inner_text() == "2 / 2"
        page.locator(f"#{after}").wait_for()
        assert page.locator("#messages > article").last.get_attribute("id") == after  # in its place, before the note
    second_text = alice.locator(f"{in_slot} .body").inner_text()
    assert second_text != first_text
    previous = alice.get_by_role("button", name="Previous version")
    box = previous.bounding_box()
    assert box is not None and box["width"] >= 24 and box["height"] >= 24
    previous.click()
    for page in (alice, bob):
        page.wait_for_selector(f"{in_slot}#msg-{slot}[data-version='1']")
        assert page.locator(in_slot).count() == 1
        assert page.locator(f"{in_slot} .version-count").inner_text() == "1 / 2"
        assert page.locator(f"{in_slot} .body").inner_text() == first_text
        assert page.get_by_role("button", name="Previous version").is_disabled()
        assert page.locator("#messages > article").last.get_attribute("id") == after
    # The button clicked went with the old article: the focus is on the new one's other button.
    assert alice.evaluate("document.activeElement.getAttribute('aria-label')") == "Next version"
    assert alice.locator("#errors .error").count() == 0 and bob.locator("#errors .error").count() == 0
    assert axe_violations(alice) == []  # the control's names, roles and contrast
