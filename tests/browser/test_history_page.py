"""History in a real browser: Edit and Delete show on one's own messages only, the edit box
loads in place and its Save reaches every member; a delete asks first and leaves a
tombstone; the header's search box finds a message and its result opens the room there."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.browser.conftest import open_room, screenshot, send

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(120)]


def test_edit_and_delete_ones_own_message(chromium: Any, site: Any) -> None:
    alice, bob = open_room(chromium, site, "alice"), open_room(chromium, site, "bob")
    text = f"a note to fix {uuid.uuid4().hex[:8]}"
    send(alice, text)
    mine = alice.locator("article[data-role=user]", has_text=text)
    theirs = bob.locator("article[data-role=user]", has_text=text)
    mine.wait_for()
    theirs.wait_for()
    assert mine.locator(".act.edit").is_visible() and mine.locator(".act.delete").is_visible()
    assert not theirs.locator(".act.edit").is_visible() and not theirs.locator(".act.delete").is_visible()
    screenshot(alice, "history-own-message")

    mine.locator(".act.edit").click()
    box = alice.locator(".edit-form textarea")
    box.wait_for()
    assert box.input_value() == text  # the text as written, not its HTML
    box.fill(f"{text}, `fixed` **as typed**")
    alice.locator(".edit-form button[type=submit]").click()
    edited = bob.locator("article[data-edited='1']", has_text="fixed")
    edited.wait_for()
    assert edited.locator("code").inner_text() == "fixed" and edited.locator(".edited").is_visible()
    assert "**as typed**" in edited.locator(".body").inner_text()  # a person's text keeps its asterisks
    screenshot(bob, "history-edited")

    alice.once("dialog", lambda dialog: dialog.accept())  # "Delete this message?"
    alice.locator("article[data-edited='1'] .act.delete").click()
    bob.locator("article[data-deleted='1'] .tombstone").wait_for()
    assert text not in bob.locator("#messages").inner_text()


def test_search_from_the_room_and_open_a_result(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    word = f"zebra{uuid.uuid4().hex[:6]}"
    send(alice, f"look for the {word} here")
    alice.locator("article[data-role=user]", has_text=word).wait_for()
    alice.locator(".room-head form.search input[name=q]").fill(word)
    alice.locator(".room-head form.search input[name=q]").press("Enter")
    hit = alice.locator("li.hit")
    hit.wait_for()
    assert hit.count() == 1 and hit.locator("mark").inner_text() == word
    screenshot(alice, "history-search")
    hit.locator("a").click()
    alice.wait_for_url("**/r/lab/?at=*")
    target = alice.locator("article:target")
    target.wait_for()
    assert word in target.inner_text()
    screenshot(alice, "history-context")
