"""Thinking and honest endings in a real browser (docs/wire.md): a reasoning reply's
thinking shows in an open "Thinking" block while the model thinks, folds when the
answer starts, opens again on a click; a reply cut off at max_tokens says so, and its
Continue button makes the same reply go on."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import finished, open_room, screenshot, send

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(120)]

# 150 thinking tokens at 75 tokens/s ("+slow": 2 s), then the answer, cut at 180 tokens in all.
THINKER = """
from collab.chat.models import Assistant, Room
room = Room.objects.get(slug="lab")
provider = room.assistants.get(handle="a").provider
room.assistants.add(Assistant.objects.create(
    handle="thinker", display_name="THINKER", provider=provider, model="sim+slow+think@150", max_tokens=180,
    available_to="everyone"))
"""
ARTICLE = "article[data-author=THINKER]"


def test_thinking_folds_when_the_answer_starts_and_a_cut_off_reply_continues(chromium: Any, site: Any) -> None:
    site.shell(THINKER)
    page = open_room(chromium, site, "bob")
    send(page, "@thinker think it over")
    thinking = page.locator(f"{ARTICLE} details.thinking")
    # While it thinks: the block is shown, open, and grows.
    page.wait_for_function(
        f"""() => {{ const d = document.querySelector('{ARTICLE} details.thinking');
                   return d && d.open && d.querySelector('.thinking-body').textContent.length > 20; }}"""
    )
    assert thinking.is_visible()
    assert page.locator(f"{ARTICLE} .body").first.inner_text() == ""
    # The answer's first piece folds it.
    page.wait_for_function(
        f"""() => {{ const a = document.querySelector('{ARTICLE}');
                   return a.querySelector('.body').textContent.length > 0 && !a.querySelector('details.thinking').open; }}"""
    )
    finished(page, 1)
    article = page.locator(ARTICLE)
    assert article.get_attribute("data-finish") == "length"
    assert (
        article.locator(".cutoff").text_content() == "cut off at the token limit"
    )  # "cut off" shown, the rest for readers
    assert not thinking.evaluate("d => d.open")
    thinking.locator("summary").click()  # a click opens it again
    assert thinking.evaluate("d => d.open") and thinking.locator(".thinking-body").is_visible()
    screenshot(page, "thinking-cut-off")
    before = len(article.locator(".body").inner_text())
    article.locator("button.continue").click()
    page.wait_for_function(f"() => document.querySelector('{ARTICLE}').dataset.status === 'streaming'")
    finished(page, 1)
    assert len(page.locator(ARTICLE).locator(".body").inner_text()) > before  # the same reply, longer
    assert page.locator(ARTICLE).count() == 1
