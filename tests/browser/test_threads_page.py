"""Threads in Chromium (docs/wire.md, "threads"): a thread opened beside the room, a
question to an assistant asked in it, answered from the thread's history (the simulated
model's record of the request it got), the "N replies" line live on another member's
page, the thread out of the room's list, and axe clean on the room with the thread open,
on a desktop and full screen on a phone."""

from __future__ import annotations

from typing import Any

import pytest

from collab.simulator.app import SimulatorApp
from tests.browser.conftest import axe_violations, open_room, screenshot, send

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(180)]


def sent_with(app: SimulatorApp, words: str) -> list[str]:
    """The turns (after the system prompt) of the last request whose last turn holds `words`."""
    for request in reversed(app.recorded):
        if words in request["messages"][-1]["content"]:
            return [t["content"] for t in request["messages"][1:]]
    raise AssertionError(f"the model got no request ending with {words!r}")


def violations_text(violations: list[dict[str, Any]]) -> str:
    return "\n".join(f"{v['id']} ({v['impact']}): {v['help']}\n  " + "\n  ".join(v["nodes"]) for v in violations)


def test_a_thread_answered_from_its_own_history_live_for_everyone(
    chromium: Any, site: Any, sim_app: tuple[str, SimulatorApp]
) -> None:
    alice = open_room(chromium, site, "alice")
    bob = open_room(chromium, site, "bob")
    send(alice, "Shall we ship the parser on Friday?")
    send(bob, "Unrelated: the coffee machine is broken again")
    parent = alice.locator("#messages article[data-role=user]", has_text="ship the parser").last
    parent.wait_for()
    bob.locator("#messages article", has_text="coffee machine").wait_for()
    parent_id = parent.get_attribute("id").removeprefix("msg-")

    parent.hover()
    parent.get_by_role("button", name="Reply in thread").click()
    panel = alice.locator("#thread")
    panel.locator(".thread-view").wait_for()
    assert panel.is_visible() and alice.locator(".room.thread-open").count() == 1
    box = alice.locator("#thread-box")
    assert box.evaluate("el => el === document.activeElement")  # the panel's box has the focus
    box.fill("@a what could go wrong with a Friday release?")
    box.press("Enter")

    thread_list = alice.locator(f"#thread-{parent_id}-list")
    thread_list.locator("article[data-role=user]", has_text="Friday release").wait_for()
    answer = thread_list.locator("article[data-role=assistant]")
    answer.wait_for()
    alice.wait_for_function(
        f"() => document.querySelector('#thread-{parent_id}-list article[data-role=assistant]')"
        ".getAttribute('data-status') === 'done'"
    )
    assert box.input_value() == ""  # emptied once the thread showed our message
    # The room's list holds none of it; the parent says "2 replies", on bob's page too, live.
    assert alice.locator("#messages article[data-thread]").count() == 0
    assert bob.locator("#messages article[data-thread]").count() == 0
    for page in (alice, bob):
        page.wait_for_function(
            f"() => (document.querySelector('#msg-{parent_id}-thread') || {{}}).textContent?.includes('2 replies')"
        )
    assert "last" in bob.locator(f"#msg-{parent_id}-thread").inner_text()

    # The assistant was sent the thread: the message it hangs on, then the thread; not the room.
    turns = sent_with(sim_app[1], "Friday release")
    assert turns == [
        "alice: Shall we ship the parser on Friday?",
        "alice: @a what could go wrong with a Friday release?",
    ]
    assert not any("coffee" in t for t in turns)
    stored = answer.locator(".body").inner_text()
    assert stored.strip()

    # Bob opens the thread from the line: he sees the same answer, and axe finds nothing.
    bob.locator(f"#msg-{parent_id}-thread button").click()
    bob.locator(f"#thread-{parent_id}-list article[data-role=assistant][data-status=done]").wait_for()
    violations = axe_violations(alice)
    screenshot(alice, "thread-open")
    assert violations == [], violations_text(violations)
    alice.locator(".thread-close").click()
    assert not alice.locator("#thread").is_visible()
    bob.context.close()

    # A search result in the thread opens the room with the thread open, at that message.
    alice.goto(f"{site.url}/r/lab/search?q=Friday+release")
    alice.locator("ol.hits li.hit a").first.click()
    alice.wait_for_url(f"**/r/lab/?thread={parent_id}#msg-*")
    alice.locator(f"#thread-{parent_id}-list article[data-role=user]", has_text="Friday release").wait_for()
    # The room around a message (?at=) has no panel: its thread's line opens the live room's.
    seq = alice.locator("#thread .thread-parent").get_attribute("data-seq")
    alice.goto(f"{site.url}/r/lab/?at={seq}")
    alice.locator(f"#msg-{parent_id}-thread button").click()
    alice.wait_for_url(f"**/r/lab/?thread={parent_id}")
    alice.locator(f"#thread-{parent_id}-list article[data-role=assistant]").wait_for()
    alice.context.close()


def test_a_thread_on_a_phone_is_full_screen_and_clean(chromium: Any, site: Any) -> None:
    phone = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True}
    page = open_room(chromium, site, "carol", color_scheme="dark", **phone)
    send(page, "A phone's thread")
    parent = page.locator("#messages article[data-role=user]", has_text="A phone's thread").last
    parent.wait_for()
    parent.locator("button.more").tap()  # the "⋯" behind which a phone's actions are
    parent.get_by_role("button", name="Reply in thread").tap()
    page.locator("#thread .thread-view").wait_for()
    box = page.locator("#thread").bounding_box()
    assert box is not None and box["width"] >= 389 and box["height"] >= 800  # the whole screen
    page.locator("#thread-box").fill("in the thread, from a phone")
    page.locator("#thread-box").press("Enter")
    page.locator("#thread article[data-role=user]", has_text="from a phone").wait_for()
    violations = axe_violations(page)
    screenshot(page, "thread-phone")
    assert violations == [], violations_text(violations)
    page.context.close()


def test_an_open_thread_catches_up_after_a_reconnect(chromium: Any, site: Any) -> None:
    """The page's socket drops while a reply streams in the open thread and someone else
    posts there: once it is back, the snapshot's #thread-live continues the reply in the
    panel (its pieces after it), and the panel reads what was posted meanwhile."""
    alice = open_room(chromium, site, "alice")
    bob = open_room(chromium, site, "bob")
    send(alice, "A thread to drop out of")
    parent = alice.locator("#messages article[data-role=user]", has_text="drop out of").last
    parent.wait_for()
    parent_id = parent.get_attribute("id").removeprefix("msg-")
    for page in (alice, bob):
        page.locator(f"#msg-{parent_id}").hover()
        page.locator(f"#msg-{parent_id} .act.thread").click()
        page.locator(f"#thread-{parent_id}-list").wait_for()
    alice.locator("#thread-box").fill("@slow take your time, in the thread")
    alice.locator("#thread-box").press("Enter")
    streaming = f"#thread-{parent_id}-list article[data-role=assistant][data-status=streaming]"
    alice.wait_for_function(f"() => (document.querySelector('{streaming} .body') || {{}}).textContent?.length >= 20")
    reply_id = alice.locator(streaming).get_attribute("id")

    alice.evaluate(
        """() => { window.snapshots = 0;
                   document.addEventListener('htmx:wsAfterMessage', e => {
                       if (String(e.detail.message).includes('id="thread-live"')) window.snapshots++; });
                   window.wsWrapper = document.querySelector('.room')['htmx-internal-data'].webSocket;
                   window.wsWrapper.socket.close(); }"""
    )
    alice.wait_for_selector("#conn.warn")
    bob.locator("#thread-box").fill("posted while alice was away")
    bob.locator("#thread-box").press("Enter")
    bob.locator(f"#thread-{parent_id}-list article", has_text="while alice was away").wait_for()
    alice.evaluate("() => window.wsWrapper.init()")
    alice.wait_for_function("() => window.snapshots >= 1")
    # The streaming reply came back from the snapshot, once, in the panel, and grows on.
    alice.wait_for_function(
        f"""() => {{ const a = document.querySelectorAll('#{reply_id}');
                    const b = a.length === 1 && a[0].querySelector('.body');
                    return a.length === 1 && a[0].closest('#thread-{parent_id}-list') !== null
                        && (a[0].getAttribute('data-status') !== 'streaming'
                            || (a[0].hasAttribute('data-length')
                                && b.textContent.length > Number(a[0].getAttribute('data-length')))); }}"""
    )
    assert alice.locator("#thread-live > *").count() == 0
    alice.locator(f"#thread-{parent_id}-list article", has_text="while alice was away").wait_for()
    alice.locator(f"#{reply_id}[data-status=done]").wait_for(timeout=30_000)
    assert alice.locator("#messages article[data-thread]").count() == 0
    alice.context.close()
    bob.context.close()


def test_a_thread_opened_while_its_reply_streams_shows_it_exactly(chromium: Any, site: Any) -> None:
    """A page keeps the replies streaming in threads it has not open (hidden, in
    #thread-live): its pieces always find them, so it logs no missing target, and opening
    the thread shows the reply as streamed, not its stored checkpoint with pieces after."""
    alice = open_room(chromium, site, "alice")
    bob = open_room(chromium, site, "bob")
    errors: list[str] = []
    bob.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    send(alice, "A thread to open late")
    parent = alice.locator("#messages article[data-role=user]", has_text="open late").last
    parent.wait_for()
    parent_id = parent.get_attribute("id").removeprefix("msg-")
    parent.hover()
    parent.get_by_role("button", name="Reply in thread").click()
    alice.locator("#thread-box").fill("@slow write on, in the thread")
    alice.locator("#thread-box").press("Enter")
    live = f"#thread-{parent_id}-list article[data-role=assistant][data-status=streaming] .body.raw"
    alice.wait_for_function(f"() => (document.querySelector('{live}') || {{}}).textContent?.length >= 40")
    bob.locator(f"#msg-{parent_id}-thread button").click()  # "2 replies": bob opens it mid-reply
    bob.wait_for_function(f"() => (document.querySelector('{live}') || {{}}).textContent?.length >= 80")
    ours, theirs = (page.locator(live).text_content() or "" for page in (bob, alice))
    assert ours and theirs and (theirs.startswith(ours) or ours.startswith(theirs)), (ours[:200], theirs[:200])
    for page in (alice, bob):
        page.locator(f"#thread-{parent_id}-list article[data-role=assistant][data-status=done]").wait_for(
            timeout=30_000
        )
    assert not [e for e in errors if "oobErrorNoTarget" in e], errors
    assert bob.locator("#thread-live > *").count() == 0
    alice.context.close()
    bob.context.close()
