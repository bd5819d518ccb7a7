"""Steering a reply while it streams, in a real browser (docs/wire.md, "steer a reply"):
bob, in a second browser context, clicks Steer on alice's streaming reply and sends a note;
both pages see, live, the marker ("↪ steered by bob: ...") and then the continued text
in the same article, which ends `done` with both parts and the marker between them. The
simulated model's `{{hold}}` keeps the first request streaming until it is steered."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import axe_violations, open_room, screenshot, send, streaming_article

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(120)]

NOTE = "shorter, and in French"
MARK = f"\u21aa steered by bob: {NOTE}"

# What each page saw of the streaming article, recorded as it changed (not polled after the
# fact): the marker shown as one (stream.js's `p.steer-mark`, at its next frame), and text
# after it in the reply's body (the pieces as they came), while the reply still streamed.
WATCH = """mark => {
  window.steerSeen = { marker: false, after: false };
  new MutationObserver(() => {
    const a = document.querySelector("article[data-status=streaming]");
    if (!a) return;
    const live = a.querySelector(".live p.steer-mark");
    if (live && live.textContent.startsWith(mark)) window.steerSeen.marker = true;
    const raw = a.querySelector(".body.raw").textContent, at = raw.indexOf(mark);
    if (at >= 0 && raw.slice(at + mark.length).trim()) window.steerSeen.after = true;
  }).observe(document.getElementById("messages"), { childList: true, subtree: true, characterData: true });
}"""


@pytest.fixture(scope="module")
def steady(site: Any) -> str:
    """@steady: up to 1,000 tokens a request: a held first request streams for 50 s (20
    tokens/s), the steered one for about 1 s (750 tokens/s)."""
    site.shell(
        "from collab.chat.models import Assistant, Room\n"
        "from collab.chat.services import providers\n"
        "provider = providers.ensure_default_assistant().provider\n"
        "Room.objects.get(slug='lab').assistants.add(Assistant.objects.create(handle='steady', "
        "display_name='STEADY', provider=provider, model='sim', max_tokens=1000, available_to='everyone'))"
    )
    return "steady"


def test_a_member_steers_a_streaming_reply_seen_live_by_both(chromium: Any, site: Any, steady: str) -> None:
    alice = open_room(chromium, site, "alice")
    bob = open_room(chromium, site, "bob")
    for page in (alice, bob):
        page.evaluate(WATCH, MARK)
    send(alice, f"@{steady} {{{{hold}}}} tell me about boats")
    reply = streaming_article(bob, 20)
    reply_id = reply.get_attribute("id")
    reply.locator("button.act.steer").click()
    box = bob.get_by_label("A note this reply follows from its next sentence")
    box.wait_for()
    assert reply.locator("button.act.steer").get_attribute("aria-expanded") == "true"
    violations = axe_violations(bob)
    assert violations == [], violations  # the note's form: its label, its buttons
    box.fill(NOTE)
    box.press("Enter")
    for page in (alice, bob):
        done = page.locator(f"#{reply_id}[data-status=done]")
        done.wait_for(timeout=60_000)
        seen = page.evaluate("window.steerSeen")
        errors = page.locator("#errors").inner_text()
        assert seen == {"marker": True, "after": True}, (seen, errors)  # live: the marker, then text after it
        mark = done.locator(".body span.steer-mark")
        assert mark.inner_text() == MARK
        paragraphs = done.locator(".body > *")
        texts = [paragraphs.nth(i).inner_text() for i in range(paragraphs.count())]
        at = texts.index(MARK)
        assert at > 0 and any(t.strip() for t in texts[:at]) and any(t.strip() for t in texts[at + 1 :])
        assert page.locator("#errors .error").count() == 0
    assert bob.locator("form.steer-form").count() == 0  # the form went with the streaming article
    alice.locator(f"#{reply_id} .body span.steer-mark").scroll_into_view_if_needed()
    screenshot(alice, "steered-reply")
