"""A person's message, in a real browser: another member reads every character that was
typed (collab/chat/markup.py, `as_typed`; docs/wire.md, "WebSocket")."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import open_room, send

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(120)]

TYPED = 'what is 17*23? "17*23" snake_case_name 2*3*4'


def test_another_member_reads_exactly_what_was_typed(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    bob = open_room(chromium, site, "bob")
    send(alice, TYPED)
    article = bob.locator("article[data-role=user]", has_text="snake_case").last
    article.wait_for()
    assert article.locator(".body").inner_text().strip() == TYPED
    assert article.locator(".body em, .body strong").count() == 0
    bob.reload()  # the page as stored, not only as the frame brought it
    bob.wait_for_selector("#conn.ok")
    assert (
        bob.locator("article[data-role=user]", has_text="snake_case").last.locator(".body").inner_text().strip()
        == TYPED
    )
