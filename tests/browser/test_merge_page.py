"""Merge in a real browser (docs/wire.md, "merge"): a question's Merge button shows once
two of its replies are approved (by votes cast with the page's buttons), and so does a
"Merge these 2 answers" button under the last of them; a click streams a merge to every
member's page, with `data-merge-of` and a "merged from" mark linking the answers it drew
from by the numbers the page and the export show."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.browser.conftest import finished, open_room, screenshot, send

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(120)]


def test_the_merge_button_shows_once_two_replies_are_approved_and_merges_for_everyone(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    bob = open_room(chromium, site, "bob")
    send(alice, "@a @b which fruit for the party?")
    finished(alice, 2)
    question = alice.locator("article[data-role=user]").last
    qid = question.get_attribute("id").removeprefix("msg-")  # type: ignore[union-attr]
    merge = question.locator(".act.merge")
    replies = alice.locator(f"article[data-reply-to='{qid}']")
    assert replies.count() == 2
    assert not merge.is_visible()  # no reply approved yet
    ids = [replies.nth(i).get_attribute("id").removeprefix("msg-") for i in range(2)]  # type: ignore[union-attr]
    alice.locator(f"#msg-{ids[0]}-votes .act.vote.up").click()
    alice.wait_for_selector(f"#msg-{ids[0]}-votes[data-verdict=approved]")
    assert not merge.is_visible()  # one approved: not enough
    alice.locator(f"#msg-{ids[1]}-votes .act.vote.up").click()
    alice.wait_for_selector(f"#msg-{ids[1]}-votes[data-verdict=approved]")
    merge.wait_for(state="visible")
    # Where the reader is looking: under the last approved answer.
    these = alice.locator(f".merge-these[data-for='{qid}'] button")
    these.wait_for(state="visible")
    assert these.inner_text() == "Merge these 2 answers"
    assert (
        alice.evaluate(f"() => document.querySelector('.merge-these[data-for=\"{qid}\"]').previousElementSibling.id")
        == f"msg-{ids[1]}"
    )
    these.click()
    sources = ",".join(ids)
    seqs = [alice.locator(f"#msg-{i}").get_attribute("data-seq") for i in ids]
    assert [alice.locator(f"#msg-{i} a.seq").inner_text() for i in ids] == [f"#{s}" for s in seqs]  # shown on each
    for page in (alice, bob):
        merged = page.locator(f"article[data-merge-of='{sources}']")
        merged.wait_for()
        page.wait_for_selector(f"article[data-merge-of='{sources}']:not([data-status=streaming])")
        mark = merged.locator(".merged-from")
        assert mark.inner_text() == f"merged from #{seqs[0]}, #{seqs[1]}"
        assert [mark.locator("a").nth(i).get_attribute("href") for i in range(2)] == [f"#msg-{i}" for i in ids]
        assert merged.get_attribute("data-reply-to") == qid
    # The export numbers the same messages the same way, and keeps what the merge drew from.
    exported = json.loads(alice.request.get(f"{site.url}/r/lab/export.json").body())["messages"]
    (record,) = [m for m in exported if m["merged_from"]]
    assert record["merged_from"] == [int(s) for s in seqs]
    assert {m["id"]: m["seq"] for m in exported if str(m["id"]) in ids} == {
        int(i): int(s) for i, s in zip(ids, seqs, strict=True)
    }
    assert alice.locator("#errors .error").count() == 0
    # The picture in the README: the two approved answers, then their merge.
    alice.set_viewport_size({"width": 1280, "height": 1300})
    alice.mouse.move(0, 0)
    alice.locator(f"article[data-merge-of='{sources}'] header").evaluate("h => h.scrollIntoView({block: 'center'})")
    alice.wait_for_function(
        "() => [...document.querySelectorAll('.msg .tools')].every(t => getComputedStyle(t).opacity === '0')"
    )
    screenshot(alice, "votes-merge")
