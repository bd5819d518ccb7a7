"""The room page's finish in Chromium (issue 34): the view follows the reader, the room's
state disables what would be refused, the reply chrome is calm with targets of at least
24 px, and a shared personal reply says whose it was."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.browser.conftest import PASSWORD, finished, open_page, open_room, screenshot, send

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(180)]

PHONE = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True}

# Where the list is scrolled: its top, how far from its end, and whether `sel` is in view.
SCROLL = """sel => { const l = document.getElementById('messages'), r = l.getBoundingClientRect();
  const a = sel ? document.querySelector(sel) : null, b = a && a.getBoundingClientRect();
  return {top: l.scrollTop, fromEnd: l.scrollHeight - l.scrollTop - l.clientHeight,
          inView: !!b && b.top >= r.top - 1 && b.bottom <= r.bottom + 1}; }"""

# Every control a person can tap in the room's chat column (links inside message text are
# inline, WCAG 2.5.8's exception), with its rendered size.
TARGETS = """() => [...document.querySelectorAll(
    '.chat button, .chat summary, .chat a:not(.body a):not(.skip), .chat input:not([type=hidden]), .chat [tabindex="0"]')]
  .filter(e => { const s = getComputedStyle(e), r = e.getBoundingClientRect();
                 return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && e.id !== 'messages'; })
  .map(e => { const r = e.getBoundingClientRect();
              return {what: (e.className || e.tagName) + ' ' + (e.textContent || '').trim().slice(0, 20),
                      w: Math.round(r.width * 10) / 10, h: Math.round(r.height * 10) / 10}; })"""


def add_member(site: Any, name: str) -> None:
    site.shell(
        "from django.contrib.auth.models import User; from collab.chat.models import Membership, Room; "
        f"u = User.objects.create_user('{name}', password='{PASSWORD}'); "
        "Membership.objects.create(room=Room.objects.get(slug='lab'), user=u)"
    )


def settings_op(chromium: Any, site: Any, button: str, form_value: str | None = None) -> None:
    """alice (the owner) presses a button on the room's settings page."""
    page = open_page(chromium, site, "alice", "/r/lab/settings/")
    if form_value is None:
        page.get_by_role("button", name=button).click()
    else:
        page.locator(f"form:has(input[name=username][value='{form_value}'])").get_by_role("button", name=button).click()
    page.wait_for_load_state()
    page.context.close()


def fill(site: Any, tag: str, count: int) -> None:
    """`count` long messages from carol, stored as a post would be (no rate to wait for)."""
    site.shell(
        "from collab.chat.models import Message, Room; from collab.chat.services.rooms import allocate_seqs; "
        "from django.contrib.auth.models import User; room = Room.objects.get(slug='lab'); "
        "carol = User.objects.get(username='carol')\n"
        f"for i in range({count}):\n"
        f"    Message.objects.create(room=room, seq=allocate_seqs(room.pk, 1), role='user', author=carol, "
        f"author_name='carol', text='filler {tag} %d ' % i + 'a line of text to fill the view. ' * 8, "
        f"html='<p>filler {tag} %d</p>' % i + '<p>a line of text to fill the view.</p>' * 4)"
    )


def test_sending_brings_the_reader_back_and_reading_above_stays_put(chromium: Any, site: Any) -> None:
    tag = uuid.uuid4().hex[:6]
    fill(site, tag, 12)
    bob = open_room(chromium, site, "bob", viewport={"width": 1000, "height": 600})
    alice = open_room(chromium, site, "alice")
    bob.eval_on_selector("#messages", "l => { l.scrollTop = 0; l.dispatchEvent(new Event('scroll')); }")
    bob.wait_for_function("() => document.getElementById('messages').style.overflowAnchor === 'auto'")
    # Someone else's long reply streams below: the reader above is not moved, and told.
    done = bob.locator("article[data-role=assistant]:not([data-status=streaming])").count()
    send(alice, f"@a tell a long story {tag}")
    bob.locator("article[data-role=assistant][data-status=streaming]").last.wait_for()
    pill = bob.locator("#new-below")
    pill.wait_for(state="visible")
    assert bob.evaluate(SCROLL, None)["top"] == 0
    # The pill has a row of its own: it covers no message.
    pill_box, list_box = pill.bounding_box(), bob.locator("#messages").bounding_box()
    assert pill_box is not None and list_box is not None
    assert pill_box["y"] >= list_box["y"] + list_box["height"] - 0.5, (pill_box, list_box)
    finished(bob, done + 1)
    assert bob.evaluate(SCROLL, None)["top"] == 0
    # Sending brings the reader to the end, with their message in view.
    send(bob, f"back to the end {tag}")
    bob.locator("article[data-role=user]", has_text=f"back to the end {tag}").wait_for()
    bob.wait_for_function(
        "() => { const l = document.getElementById('messages'); return l.scrollHeight - l.scrollTop - l.clientHeight < 40; }"
    )
    last_user = bob.locator("article[data-role=user]").last.get_attribute("id")
    assert bob.evaluate(SCROLL, f"#{last_user}")["inView"]
    assert not pill.is_visible()


def test_a_locked_room_and_a_removed_member_disable_what_would_be_refused_live(chromium: Any, site: Any) -> None:
    name = f"m{uuid.uuid4().hex[:6]}"
    add_member(site, name)
    member = open_room(chromium, site, name)
    before = member.locator("article[data-role=assistant]").count()
    send(member, "@a hello before the lock")
    finished(member, before + 1)
    box, send_button = member.locator("#composer textarea"), member.get_by_role("button", name="Send")
    banner = member.locator("#room-status")
    assert not banner.is_visible() and box.is_enabled()
    settings_op(chromium, site, "Lock the room")
    banner.wait_for(state="visible")
    assert "locked" in banner.inner_text()
    assert (
        member.evaluate("() => getComputedStyle(document.getElementById('room-status')).backgroundColor")
        != "rgba(0, 0, 0, 0)"
    )
    member.wait_for_function("() => document.querySelector('#composer textarea').disabled")
    assert send_button.is_disabled()
    reply = member.locator("article[data-role=assistant]").last
    assert reply.locator(".act.regenerate").count() == 1 and not reply.locator(".act.regenerate").is_visible()
    assert not reply.locator(".act.vote.up").is_visible()
    screenshot(member, "room-locked")
    settings_op(chromium, site, "Unlock the room")
    member.wait_for_function("() => !document.querySelector('#composer textarea').disabled")
    assert not banner.is_visible() and send_button.is_enabled()
    reply.hover()
    assert reply.locator(".act.regenerate").is_visible()
    # Removed: a banner says so, and nothing that would be refused stays live.
    settings_op(chromium, site, "Kick", form_value=name)
    member.wait_for_function("() => document.querySelector('.room[data-gone]')")
    assert banner.is_visible() and box.is_disabled() and send_button.is_disabled()
    assert member.locator("#lens input").is_disabled()
    reply.hover()
    assert not reply.locator(".act.regenerate").is_visible() and not reply.locator(".act.vote.up").is_visible()
    screenshot(member, "room-removed")


def test_a_reply_on_a_phone_is_calm_and_every_target_is_big_enough(chromium: Any, site: Any) -> None:
    bob = open_room(chromium, site, "bob", color_scheme="dark", **PHONE)
    before = bob.locator("article[data-role=assistant]").count()
    send(bob, "@a a short answer please")
    finished(bob, before + 1)
    reply = bob.locator("article[data-role=assistant]:not([data-status=streaming])").last
    header = reply.locator("header").bounding_box()
    assert header is not None and header["height"] <= 34  # author, number, time, state: one line
    assert not reply.locator(".metrics").is_visible()  # the figures are behind "i"
    assert not reply.locator(".tools").is_visible()  # the actions are one tap away
    bob.locator("article[data-role=user]").last.evaluate("a => a.scrollIntoView({block: 'start'})")
    screenshot(bob, "room-phone-dark")  # the README's phone picture
    reply.locator("button.more").tap()
    assert reply.locator(".act.regenerate").is_visible() and reply.locator(".act.vote.up").is_visible()
    reply.locator("details.info > summary").tap()
    assert reply.locator(".metrics").is_visible() and "tokens" in reply.locator(".metrics").inner_text()
    # The lens is a room-menu item on a phone, not a permanent form.
    assert not bob.locator("#lens").is_visible()
    bob.get_by_role("button", name="Your lens").tap()
    assert bob.locator("#lens").is_visible()
    targets = bob.evaluate(TARGETS)
    small = [t for t in targets if t["w"] < 24 or t["h"] < 24]
    assert len(targets) > 10 and small == [], small
    send_box = bob.get_by_role("button", name="Send").bounding_box()
    assert send_box is not None and send_box["height"] >= 44
    screenshot(bob, "room-phone-dark-open")


def test_on_a_desktop_the_actions_show_on_hover_and_focus(chromium: Any, site: Any) -> None:
    bob = open_room(chromium, site, "bob", viewport={"width": 1280, "height": 800})
    before = bob.locator("article[data-role=assistant]").count()
    send(bob, "@a hover over me")
    finished(bob, before + 1)
    reply = bob.locator("article[data-role=assistant]").last
    tools = reply.locator(".tools")
    bob.mouse.move(1, 1)
    assert tools.evaluate("t => getComputedStyle(t).opacity") == "0"
    reply.hover()
    bob.wait_for_function("t => getComputedStyle(t).opacity === '1'", arg=tools.element_handle())
    bob.mouse.move(1, 1)
    reply.locator(".act.regenerate").focus()  # by keyboard too
    bob.wait_for_function("t => getComputedStyle(t).opacity === '1'", arg=tools.element_handle())
    assert not reply.locator(".metrics").is_visible() and "tok/s" not in reply.locator("header").inner_text()


def test_a_shared_personal_reply_says_whose_it_was_and_its_lens(chromium: Any, site: Any) -> None:
    tag = uuid.uuid4().hex[:6]
    carol = open_room(chromium, site, "carol", viewport={"width": 1280, "height": 900})
    alice = open_room(chromium, site, "alice", viewport={"width": 1280, "height": 900})
    lens = f"answer in one line {tag}"
    carol.locator("#lens-box").fill(lens)
    carol.locator("#lens").get_by_role("button").click()
    carol.locator("#lens .lens-now", has_text=lens).wait_for()
    send(alice, f"/each @a how do we ship {tag}?")
    # alice is told, under her question, what started and for whom.
    notice = alice.locator("#messages .thread-notice[data-code='each.started']").last
    notice.wait_for()
    assert "for " in notice.inner_text() and "carol" in notice.inner_text()
    assert alice.locator("#errors .notice, #errors .error").count() == 0
    carol.locator("article[data-recipient=carol]").last.wait_for()
    rid = carol.locator("article[data-recipient=carol]").last.get_attribute("id")
    mine = carol.locator(f"#{rid}:not([data-status=streaming])")  # its final article, once it ends
    mine.wait_for()
    assert "for you" in mine.locator("header .personal").inner_text()
    mine.hover()
    mine.locator(".act.share").click()
    shared = alice.locator(f"#{rid}")
    shared.wait_for()
    mark = shared.locator("header .personal.shared")
    assert mark.inner_text() == "for carol · shared"
    assert mark.get_attribute("title") == f"Lens: {lens}"
