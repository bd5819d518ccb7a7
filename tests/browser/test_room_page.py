"""The room in a real browser (Debian's Chromium through Playwright) against a real
Daphne and the simulated model: what a team sees, clicking and typing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import finished, open_room, screenshot, send, streaming_article

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
  }).observe(document.body, {childList: true, subtree: true, characterData: true});  // the snapshot may replace #messages
}"""


def test_two_members_watch_two_replies_grow_then_render(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice", viewport={"width": 1280, "height": 1280})
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
    # The picture in the README: the question, then both replies as they ended.
    alice.locator("article[data-role=user]").last.evaluate("a => a.scrollIntoView({block: 'start'})")
    alice.locator("#composer textarea").blur()
    screenshot(alice, "room-two-replies")


def test_stop_from_the_page(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    bob = open_room(chromium, site, "bob")
    send(alice, "@slow tell me everything")
    article = streaming_article(alice)
    article_id = article.get_attribute("id")
    # Only those who may stop see Stop: the asker, not another member.
    assert bob.locator(f"#{article_id}").get_by_role("button", name="Stop").count() == 0
    article.get_by_role("button", name="Stop").click()
    for page in (alice, bob):
        page.wait_for_selector(f"#{article_id}[data-status=stopped]")
        assert len(page.locator(f"#{article_id} .body").inner_text()) >= 20
    assert alice.locator("#errors .error").count() == 0


def test_reload_mid_reply_resumes(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    send(alice, "@slow a long answer please")
    article = streaming_article(alice, 40)
    article_id = article.get_attribute("id")
    # Watched from the reloaded page's first parse, not after it connects: on a loaded
    # machine the reply may be far along (or over) by the time the socket is open.
    alice.add_init_script(f"document.addEventListener('DOMContentLoaded', () => ({WATCH_GROWTH})())")
    alice.reload()
    alice.wait_for_selector("#conn.ok")
    # The page and its snapshot still know who asked: alice sees Stop, bob (opening now) does not.
    assert alice.locator(f"#{article_id}").get_by_role("button", name="Stop").count() == 1
    bob = open_room(chromium, site, "bob")
    bob.wait_for_selector(f"#{article_id}[data-status=streaming]")
    assert bob.locator(f"#{article_id}").get_by_role("button", name="Stop").count() == 0
    alice.wait_for_selector(f"#{article_id}[data-status=done]", timeout=30_000)
    growth = alice.evaluate("window.__growth")
    assert len(growth[article_id]["lengths"]) >= 3  # it went on growing after the reload
    stored = site.shell(
        f"from collab.chat.models import Message; print(len(Message.objects.get(pk={article_id[4:]}).text))"
    )
    assert int(stored.strip().splitlines()[-1]) > 40


def test_the_owner_sees_stop_on_a_members_reply(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    bob = open_room(chromium, site, "bob")
    # {{hold}}: the simulated model streams until the reply is stopped, so the click below
    # cannot lose a race with the reply's own end on a slow machine.
    send(bob, "@slow and what do you think? {{hold}}")
    article_id = streaming_article(bob).get_attribute("id")
    alice.wait_for_selector(f"#{article_id}[data-status=streaming]")
    # The asker and the owner (who moderates) may stop it: both see Stop. The owner stops it.
    assert bob.locator(f"#{article_id}").get_by_role("button", name="Stop").count() == 1
    alice.locator(f"#{article_id}").get_by_role("button", name="Stop").click()
    for page in (alice, bob):
        page.wait_for_selector(f"#{article_id}[data-status=stopped]")
    assert alice.locator("#errors .error").count() == 0


def test_server_restart_mid_reply(chromium: Any, site: Any) -> None:
    """Daphne killed (SIGKILL) mid-reply and started again on the same port: each page
    reconnects by itself, the reply ends `interrupted` with the text it had (the new
    process's sweep), and nobody is logged out."""
    alice = open_room(chromium, site, "alice")
    bob = open_room(chromium, site, "bob")
    send(alice, "@slow a long answer before the restart")
    # Some 2 s in: the database's checkpoint of the text (at most 1 s behind) holds some.
    article = streaming_article(alice, 600)
    article_id = article.get_attribute("id")
    assert site.proc is not None
    site.proc.kill()
    site.proc.wait(10)
    for page in (alice, bob):
        page.wait_for_selector("#conn:not(.ok)")  # the page noticed the drop
        assert page.locator(f"#{article_id}").get_attribute("data-status") == "streaming"
    site.start()
    for page in (alice, bob):
        page.wait_for_selector("#conn.ok", timeout=30_000)  # reconnected, not refused (4403)
        page.wait_for_selector(
            f"#{article_id}[data-status=interrupted], #{article_id}[data-status=failed]", timeout=45_000
        )
        assert len(page.locator(f"#{article_id} .body").inner_text()) >= 200  # the text it had, kept
        assert page.locator("#composer textarea").is_enabled()
    # Still logged in: the page loads again as the room, not the login form.
    alice.reload()
    alice.wait_for_selector("#conn.ok")
    assert "/accounts/login" not in alice.url
    screenshot(alice, "room-after-restart")
