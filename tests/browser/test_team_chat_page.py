"""A team's page with issue 35's parts together, in Chromium: alice in the room, with her
rooms beside it (another room's unread count and mention mark arrive live), a reaction
from bob on her question, a thread on it answered by an assistant, and a reply that bob
steers while it streams. It takes the README's picture of the room
(docs/images/team-chat.png) and checks axe on it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import axe_violations, open_page, open_room, screenshot, send

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(180)]

DESIGN = """
from django.contrib.auth.models import User
from collab.chat.models import Membership
from collab.chat.services import rooms
design = rooms.create_room(User.objects.get(username="bob"), "Design", topic="mockups")
Membership.objects.create(room=design, user=User.objects.get(username="alice"))
print(design.pk)
"""


def test_rooms_a_thread_reactions_and_a_steer_on_one_page(chromium: Any, site: Any) -> None:
    design_id = int(site.shell(DESIGN).strip().splitlines()[-1])
    alice = open_room(chromium, site, "alice", viewport={"width": 1440, "height": 900})
    bob = open_room(chromium, site, "bob")
    bob_design = open_page(chromium, site, "bob", "/r/design/")
    bob_design.wait_for_selector("#conn.ok")

    # Another room: bob mentions alice there; her sidebar counts it and marks the mention.
    entry = f"#nav-room-{design_id}"
    alice.wait_for_selector(entry)
    send(bob_design, "@alice the mockups are up, can you look before the review?")
    alice.wait_for_selector(f"{entry}[data-unread='1'][data-mention='1'] .mentioned")

    # In the room: alice asks; bob reacts to it from the picker's quick set.
    send(alice, "Shall we ship the parser on Friday?")
    question = alice.locator("#messages article[data-role=user]", has_text="ship the parser").last
    question.wait_for()
    qid = question.get_attribute("id")
    bob.locator(f"#{qid}-reactions .react-add").click()
    bob.locator("#reaction-picker .pick[data-emoji='🎉']").click()
    alice.wait_for_selector(f"#{qid}-reactions .reaction[data-emoji='🎉'] .n:text-is('1')")

    # A thread on it, answered by an assistant; the room's line says so, on bob's page too.
    question.hover()
    question.get_by_role("button", name="Reply in thread").click()
    alice.locator("#thread .thread-view").wait_for()
    box = alice.locator("#thread-box")
    box.fill("@a what could go wrong with a Friday release?")
    box.press("Enter")
    parent_id = qid.removeprefix("msg-")
    alice.wait_for_selector(f"#thread-{parent_id}-list article[data-role=assistant][data-status=done]")
    for page in (alice, bob):
        page.wait_for_selector(f"#msg-{parent_id}-thread[data-replies='2']")

    # In the room again: a reply bob steers while it streams; alice sees the marker live.
    send(alice, "@slow write up the release checklist {{hold}}")
    reply = alice.locator("#messages article[data-role=assistant][data-status=streaming]").last
    reply.wait_for()
    rid = reply.get_attribute("id")
    bob.wait_for_selector(f"#{rid}[data-status=streaming] .body:not(:empty)", state="attached")  # the raw text
    bob.locator(f"#{rid} .act.steer").click()
    note = bob.locator(f"#{rid} form.steer-form input")
    note.fill("keep it to five items")
    note.press("Enter")
    alice.wait_for_selector(f"#{rid} .steer-mark:has-text('steered by bob: keep it to five items')")
    alice.wait_for_selector(f"#{rid}[data-status=done]", timeout=60_000)
    assert "steered by bob" in alice.locator(f"#{rid} .body").inner_text()

    # The room is unchanged by the thread: its messages stay beside it, not in the list.
    assert alice.locator("#messages article[data-thread]").count() == 0
    question.scroll_into_view_if_needed()
    screenshot(alice, "team-chat")
    violations = [v for v in axe_violations(alice) if v["id"] != "heading-order"]  # the model's own headings
    assert violations == [], violations
