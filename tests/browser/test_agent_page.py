"""An agent's run in a real browser (issue 13; the log's lines: docs/architecture.md#a-agents):
the "Agent run" block is open while the agent works, its plan, tool calls and
results appear in it live under the label "step N of 8 · …", then the final answer is
rendered and the run folds (a click opens it). A tool result holding HTML shows as text.

The picture in the README, docs/images/agent-run.png, is this test's screenshot
"agent-run" (COLLAB_TEST_ARTIFACTS), copied there."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.browser.conftest import finished, open_room, screenshot, send

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(120)]

# "+slow": 75 tokens/s, so the run lasts some 10 s: the plan (300 tokens at most, 4 s),
# a step that calls a tool, its check (80 tokens at most), the answer (300 tokens, 4 s).
PLANNER = """
from collab.chat.models import Assistant, Room
room = Room.objects.get(slug="lab")
if not room.assistants.filter(handle="planner").exists():
    provider = room.assistants.get(handle="a").provider
    room.assistants.add(Assistant.objects.create(
        handle="planner", display_name="PLANNER", provider=provider, model="sim+slow", max_tokens=300, is_agent=True))
"""
ARTICLE = "article[data-author=PLANNER]"
# Scrolls the run's log (a box of its own) to a few lines above its first tool call.
SCROLL_TO_THE_CALL = """body => {
  const walker = document.createTreeWalker(body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const at = node.data.indexOf('▸ Step 2');
    if (at < 0) continue;
    const range = document.createRange();
    range.setStart(node, at);
    body.scrollTop += range.getBoundingClientRect().top - body.getBoundingClientRect().top - 60;
    return;
  }
}"""
LABEL = re.compile(r"^step [1-8] of 8 · [\d,]+ of 20,000 tokens")


def running_shows(page: Any, article_id: str, text: str) -> None:
    """Wait until the run, still working, shows `text` in its open "Agent run" block (and
    no answer yet: the answer comes at the end, apart from the run)."""
    page.wait_for_function(
        """([id, text]) => { const a = document.getElementById(id);
             const d = a && a.querySelector('details.thinking');
             return a.dataset.status === 'streaming' && d.open && d.querySelector('summary').textContent === 'Agent run'
                    && d.querySelector('.thinking-body').textContent.includes(text)
                    && a.querySelector('.body').textContent === ''; }""",
        arg=[article_id, text],
    )


def the_run(page: Any) -> tuple[Any, str]:
    """The newest agent article (as soon as it is on the page) and its id."""
    page.wait_for_selector(f"{ARTICLE}[data-status=streaming]")
    article = page.locator(ARTICLE).last
    return article, str(article.get_attribute("id"))


def test_the_run_shows_live_then_folds_under_its_answer(chromium: Any, site: Any) -> None:
    site.shell(PLANNER)
    bob = open_room(chromium, site, "bob", viewport={"width": 1280, "height": 1100})
    before = bob.locator("article[data-role=assistant]").count()
    send(bob, '@planner what is 6 * 7? {{tool calculate {"expression": "6 * 7"}}}')
    article, article_id = the_run(bob)
    running_shows(bob, article_id, "▸ Plan\n")
    running_shows(bob, article_id, '→ calculate({"expression": "6 * 7"})')
    running_shows(bob, article_id, "← calculate: 42\n")
    label = bob.wait_for_function(  # the budget, live: model calls and tokens used so far
        """id => { const s = document.getElementById(id + '-state');
                   return s && /^step [2-8] of 8 · /.test(s.textContent) && s.textContent; }""",
        arg=article_id,
    ).json_value()
    assert LABEL.match(label), label
    finished(bob, before + 1)
    assert article.get_attribute("data-status") == "done" and article.get_attribute("data-steps") == "4"
    assert article.locator(".body.md p").count() >= 1  # the final answer, rendered
    run = article.locator("details.thinking")
    assert run.locator("summary").inner_text() == "Agent run"
    assert not run.evaluate("d => d.open")  # folded under the answer
    run.locator("summary").click()  # a click opens it
    assert run.evaluate("d => d.open") and run.locator(".thinking-body").is_visible()
    log = run.locator(".thinking-body").inner_text()
    lines = [line for line in log.splitlines() if line and line[0] in "▸→←✓"]
    assert lines[:4] == ["▸ Plan", "▸ Step 2", '→ calculate({"expression": "6 * 7"})', "← calculate: 42"]
    assert lines[-2:] == ["▸ Step 4", "✓ Final answer"]
    # The picture in the README: the question, the run opened at its tool call, the answer.
    bob.locator("article[data-role=user]").last.evaluate("a => a.scrollIntoView({block: 'start'})")
    run.locator(".thinking-body").evaluate(SCROLL_TO_THE_CALL)
    bob.locator("#composer textarea").blur()
    screenshot(bob, "agent-run")


def test_a_tool_result_holding_html_shows_as_text(chromium: Any, site: Any) -> None:
    site.shell(PLANNER)
    alice = open_room(chromium, site, "alice")
    dialogs: list[str] = []
    alice.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    before = alice.locator("article[data-role=assistant]").count()
    send(alice, "a needle: <img src=x onerror=alert(1)> <b>bold</b>")
    alice.wait_for_selector("article[data-role=user] >> text=a needle:")
    send(alice, '@planner find the needle {{tool search_room {"query": "needle"}}}')
    article, article_id = the_run(alice)
    running_shows(alice, article_id, "← search_room: ")
    run = article.locator("details.thinking")
    for when in ("live", "stored"):  # the pieces as they came, then the final article's copy
        body = run.locator(".thinking-body")
        assert "<img src=x onerror=alert(1)> <b>bold</b>" in body.inner_text(), when
        assert run.locator("img, b").count() == 0, when  # text, not markup
        if when == "live":
            finished(alice, before + 1)
            run.locator("summary").click()
    assert article.get_attribute("data-status") == "done"
    assert dialogs == []
