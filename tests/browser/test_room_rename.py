"""A rename in a real browser: the owner saves a new name on the settings page, and a
member's open room page shows it in its heading, its title and its message box at once,
with no reload (templates/chat/_room_name.html; docs/wire.md, "The room's **name**")."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import open_page, open_room

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(120)]


def test_a_rename_reaches_an_open_page_heading_and_title(chromium: Any, site: Any) -> None:
    bob = open_room(chromium, site, "bob")
    bob.evaluate("window.__loaded = 'once'")  # gone if the page reloads
    assert bob.title() == "Lab · collab"
    alice = open_page(chromium, site, "alice", "/r/lab/settings/")
    alice.get_by_label("Name").fill("Lab & friends")
    alice.locator("#settings-form button[type=submit]").click()
    alice.wait_for_url(f"{site.url}/r/lab/")
    bob.wait_for_function("() => document.title === 'Lab & friends · collab'")
    assert bob.locator("#room-name").inner_text() == "Lab & friends"
    assert bob.evaluate("window.__loaded") == "once"
    assert alice.locator("#room-name").inner_text() == "Lab & friends"
    # The message box names the room too, and follows the rename without a reload.
    bob.wait_for_function(
        "() => document.getElementById('message-box').placeholder.startsWith('Message Lab & friends')"
    )
