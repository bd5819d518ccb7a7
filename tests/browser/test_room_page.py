"""The room in a real browser (Debian's Chromium through Playwright) against a real
Daphne and the simulated model: what a team sees, clicking and typing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import open_room, screenshot

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(120)]

# Records, per assistant article, every distinct length its body text had while the page
# lived, and whether it ever held rendered Markdown: how the reader saw it grow.
WATCH_GROWTH = """() => {
  window.__growth = {};
  const seen = (article) => {
    const body = article.querySelector('.body');
    if (!body) return;
    const g = window.__growth[article.id] || (window.__growth[article.id] = {lengths: [], rendered: false});
    const n = body.textContent.length;
    if (g.lengths[g.lengths.length - 1] !== n) g.lengths.push(n);
    if (article.dataset.status !== 'streaming' && body.classList.contains('md')) g.rendered = true;
  };
  new MutationObserver(() => {
    document.querySelectorAll('article[data-role=assistant]').forEach(seen);
  }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
}"""


def send(page: Any, text: str) -> None:
    box = page.locator("#composer textarea")
    box.fill(text)
    box.press("Enter")


def finished(page: Any, count: int) -> None:
    page.wait_for_function(
        "n => document.querySelectorAll('article[data-role=assistant]:not([data-status=streaming])').length >= n",
        arg=count,
    )


def test_two_members_watch_two_replies_grow_then_render(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    bob = open_room(chromium, site, "bob")
    for page in (alice, bob):
        page.evaluate(WATCH_GROWTH)
    send(alice, "@a @b tell us about **streams**")
    for page in (alice, bob):
        finished(page, 2)
        growth = page.evaluate("window.__growth")
        assert len(growth) == 2, growth
        for article_id, g in growth.items():
            # Token by token: the body was seen at many lengths before the end.
            assert len(g["lengths"]) >= 5, (article_id, g)
            assert g["rendered"], article_id
        for article in page.locator("article[data-role=assistant]").all():
            assert article.get_attribute("data-status") == "done"
            assert article.locator(".body.md p").count() >= 1
    screenshot(alice, "room-two-replies")
