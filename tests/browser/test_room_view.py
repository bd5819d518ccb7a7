"""How the room looks and behaves in a real browser: phone widths, the dark theme,
errors, code blocks, following the stream, formatting while it streams, waiting."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import finished, open_room, screenshot, send, streaming_article

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(120)]

# The relative luminance (WCAG) of an element's computed colour or background.
LUMINANCE = """([selector, prop]) => {
  const el = document.querySelector(selector);
  let value = getComputedStyle(el)[prop];
  const [r, g, b] = value.match(/[\\d.]+/g).slice(0, 3).map(Number).map(c => {
    c /= 255; return c <= 0.03928 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4);
  });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}"""


def luminance(page: Any, selector: str, prop: str) -> float:
    return float(page.evaluate(LUMINANCE, [selector, prop]))


@pytest.mark.parametrize("width", [360, 390])
def test_phone_layout(chromium: Any, site: Any, width: int) -> None:
    phone = {"viewport": {"width": width, "height": 740}, "is_mobile": True, "has_touch": True}
    page = open_room(chromium, site, "bob", **phone)
    box = page.locator("#composer textarea")
    # Long words, a long code line and a wide table must not widen the page.
    box.fill("https://example.com/" + "a-very-long-path" * 12 + "\n\n```\n" + "x = 1  # " + "y" * 200 + "\n```")
    send_button = page.get_by_role("button", name="Send")
    assert send_button.is_visible()
    send_button.tap()
    page.locator("article[data-role=user] pre").last.wait_for()
    done = page.locator("article[data-role=assistant]:not([data-status=streaming])").count()
    row = "| " + " | ".join(["wide-cell-text"] * 6) + " |"
    send(page, f"@a a table please\n\n{row}\n" + "|---" * 6 + "|\n" + row)
    finished(page, done + 1)
    sizes = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert sizes[0] <= sizes[1], f"the page is {sizes[0]} px wide in a {sizes[1]} px window"
    send_box = send_button.bounding_box()
    assert send_box is not None
    assert send_box["x"] >= 0 and send_box["x"] + send_box["width"] <= width
    assert send_box["y"] >= 0 and send_box["y"] + send_box["height"] <= 740  # on screen, no scrolling
    # The member list is behind a button.
    members = page.locator("#members")
    assert not members.is_visible()
    toggle = page.get_by_role("button", name="Members")
    assert toggle.get_attribute("aria-expanded") == "false"
    toggle.tap()
    assert members.is_visible() and toggle.get_attribute("aria-expanded") == "true"
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    screenshot(page, f"room-phone-{width}-members")
    toggle.tap()
    assert not members.is_visible()
    screenshot(page, f"room-phone-{width}")


def test_dark_mode_follows_the_system(chromium: Any, site: Any) -> None:
    light = open_room(chromium, site, "alice", color_scheme="light")
    dark = open_room(chromium, site, "alice", color_scheme="dark")
    send(dark, "@a something with `code` and **bold**")
    finished(dark, 1)
    light.locator("article[data-role=assistant]").last.wait_for()
    for selector in ("body", ".chat", "#composer textarea", "article[data-role=assistant]"):
        assert luminance(dark, selector, "backgroundColor") < 0.05, selector
        assert luminance(light, selector, "backgroundColor") > 0.6, selector
    for selector in ("body", "article[data-role=assistant] .body", "#composer textarea"):
        assert luminance(dark, selector, "color") > 0.6, selector
        assert luminance(light, selector, "color") < 0.05, selector
    screenshot(dark, "room-dark")


def test_errors_can_be_dismissed_and_do_not_pile_up(chromium: Any, site: Any) -> None:
    bob = open_room(chromium, site, "bob")
    send(bob, "hello @nobody")  # posted as written, with an error: no assistant called @nobody
    error = bob.locator("#errors .error[data-code='mention.unknown']")
    error.wait_for()
    error.get_by_role("button", name="Dismiss").click()
    error.wait_for(state="detached")
    for i in range(5):
        send(bob, f"hello @nobody{i}")
        bob.locator("#errors .error", has_text=f"@nobody{i}").wait_for()
    assert bob.locator("#errors .error").count() <= 3  # the oldest went first
    assert bob.locator("#errors .error", has_text="@nobody4").is_visible()
    screenshot(bob, "room-errors")
    bob.locator("#errors .error").first.wait_for(state="detached", timeout=15_000)  # they fade by themselves


def test_copy_button_on_a_code_block(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice", permissions=["clipboard-read", "clipboard-write"])
    send(alice, "try this:\n\n```python\nprint('copy me')\nx = 1\n```")
    block = alice.locator("article[data-role=user] pre").last
    block.wait_for()
    button = alice.locator("article[data-role=user]").last.get_by_role("button", name="Copy code")
    button.click()
    alice.wait_for_function("() => navigator.clipboard.readText().then(t => t.includes('copy me'))")
    assert alice.evaluate("() => navigator.clipboard.readText()").rstrip("\n") == "print('copy me')\nx = 1"
    assert "Copied" in button.inner_text()


def test_reading_back_stops_the_scrolling(chromium: Any, site: Any) -> None:
    """While a long reply streams, a reader who scrolls up stays where they are and is
    offered a "new messages" button, which takes them to the end."""
    bob = open_room(chromium, site, "bob", viewport={"width": 1000, "height": 600})
    send(bob, "@long1 a long one to read back")
    article = streaming_article(bob, 3000)
    pill = bob.get_by_role("button", name="New messages")
    assert not pill.is_visible()  # following the end
    bob.locator("#messages").hover()
    bob.mouse.wheel(0, -400)
    pill.wait_for()
    top = bob.evaluate("() => document.getElementById('messages').scrollTop")
    length = len(article.locator(".body").text_content() or "")
    bob.wait_for_function(  # more text came: the reader was left where they were
        "n => document.querySelector('article[data-status=streaming] .body').textContent.length > n + 2000", arg=length
    )
    assert abs(bob.evaluate("() => document.getElementById('messages').scrollTop") - top) < 2
    screenshot(bob, "room-new-messages")
    pill.click()
    bob.wait_for_function(
        "() => { const m = document.getElementById('messages'); return m.scrollHeight - m.scrollTop - m.clientHeight < 4; }"
    )
    assert not pill.is_visible()
    finished(bob, 1, timeout=30_000)


# Watches one streaming reply: whether, while it streamed, its code showed as a code
# block (a <pre> out of the raw text), and its height just before and after the final
# article replaced it.
WATCH_FORMAT = """(id) => {
  const w = window.__format = {fence: false, code: false, before: 0, after: 0};
  const tick = () => {
    const a = document.getElementById(id);
    if (!a) return requestAnimationFrame(tick);
    if (a.dataset.status === 'streaming') {
      const raw = a.querySelector('.body').textContent;
      if (raw.includes('```python')) {
        w.fence = true;
        if ([...a.querySelectorAll('pre')].some(p => p.offsetHeight > 0 && p.textContent.trim())) w.code = true;
      }
      w.before = a.getBoundingClientRect().height;
      requestAnimationFrame(tick);
    } else {
      w.after = a.getBoundingClientRect().height;
      w.done = true;
    }
  };
  tick();
}"""


def test_code_shows_as_code_while_streaming(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice", viewport={"width": 1200, "height": 900})
    send(alice, "@long2 show us some code")
    article = streaming_article(alice, 1)
    alice.evaluate(WATCH_FORMAT, article.get_attribute("id"))
    alice.wait_for_function("() => window.__format.done", timeout=30_000)
    seen = alice.evaluate("window.__format")
    print("while streaming / final article height:", seen)
    assert seen["fence"], "the reply had no code block"
    assert seen["code"], "its code did not show as a code block while it streamed"
    # The final Markdown replaces the streamed view with hardly a jump.
    assert abs(seen["after"] - seen["before"]) < 0.05 * seen["after"], seen


def test_elapsed_time_while_waiting_for_the_first_token(chromium: Any, site: Any) -> None:
    bob = open_room(chromium, site, "bob")
    send(bob, "@mute are you there?")
    article = bob.locator("article[data-role=assistant][data-author=MUTE]").last
    article.wait_for()
    header = article.locator("header")
    bob.wait_for_function(
        "el => /\\b[2-9] s\\b/.test(el.textContent)", arg=header.element_handle(), timeout=15_000
    )  # "writing… 2 s": it counts up
    assert article.get_attribute("data-status") == "streaming"
    screenshot(bob, "room-waiting")
    article.get_by_role("button", name="Stop").click()
    bob.wait_for_selector(f"#{article.get_attribute('id')}[data-status=stopped]")


def test_the_member_list_follows_who_comes_and_goes(chromium: Any, site: Any) -> None:
    """Presence is told as changes (docs/wire.md, the member list): each changed member's
    entry swapped in by its id, the list's order and the others' entries kept. Carol: no
    other test of this module opens her page (an open one would keep her online)."""
    alice = open_room(chromium, site, "alice")
    entry = alice.locator('#members li[data-user="carol"]')
    names = "() => [...document.querySelectorAll('#members li[data-user]')].map(li => li.dataset.user)"
    order = alice.evaluate(names)
    assert entry.get_attribute("data-online") == "0"
    carol = open_room(chromium, site, "carol")
    alice.wait_for_function("() => document.querySelector('#members li[data-user=carol]').dataset.online === '1'")
    assert entry.get_attribute("class") == "online" and entry.get_attribute("hx-swap-oob") is None
    assert alice.evaluate(names) == order  # swapped in place, one entry: nothing else moved or doubled
    carol.context.close()
    alice.wait_for_function("() => document.querySelector('#members li[data-user=carol]').dataset.online === '0'")
    screenshot(alice, "room-member-left")
    alice.context.close()
