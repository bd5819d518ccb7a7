"""The admin in a real browser at 1280x800 (templates/admin/, static/collab/admin.css;
docs/architecture.md#a-admin): its front page leads to the live page, usage and the audit
log; no table runs off its page or out of its box; axe finds nothing serious."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import PASSWORD, axe_violations, open_page, screenshot

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(180)]

SCREEN = {"width": 1280, "height": 800}

# Rows as long as the audit log and the room list hold: an IPv6 address, a long detail, a
# long room slug and owner name (what pushed columns out of sight).
STAFF = f"""
from django.contrib.auth.models import User
from collab.chat.models import AuditEntry, Room
from collab.chat.services import rooms
root = User.objects.create_superuser("root", password="{PASSWORD}")
owner = User.objects.create_user("a-team-lead-with-a-long-name", password="{PASSWORD}")
room = rooms.create_room(owner, "The quarterly planning room of the platform team")
for n in range(3):
    AuditEntry.objects.create(actor=root, actor_name="root", action="assistant.refused", room=room,
        room_name=room.slug, target_name="a-team-lead-with-a-long-name",
        detail="@researcher (id 12) " * 6, address="2001:db8:85a3:1234:5678:8a2e:370:7334")
"""

PAGES = {
    "front page": "/admin/",
    "rooms": "/admin/chat/room/",
    "audit log": "/admin/chat/auditentry/",
    "live": "/admin/chat/room/live/",
    "usage": "/admin/chat/room/usage/",
    "memberships": "/admin/chat/membership/",
    "messages": "/admin/chat/message/",
    "assistants": "/admin/chat/assistant/",
    "providers": "/admin/chat/provider/",
    "room": "/admin/chat/room/1/change/",
}

# Each table's right edge against the page's and its box's (the nearest ancestor that
# clips or scrolls: Django's .results): what is past either is out of sight.
OVERFLOWS = """() => {
  const out = [];
  const page = document.documentElement;
  if (page.scrollWidth > page.clientWidth) out.push(`the page scrolls: ${page.scrollWidth} > ${page.clientWidth}`);
  for (const table of document.querySelectorAll('table')) {
    const right = table.getBoundingClientRect().right;
    let box = table.parentElement;
    while (box && getComputedStyle(box).overflowX === 'visible') box = box.parentElement;
    const limit = Math.min(page.clientWidth, box ? box.getBoundingClientRect().right : page.clientWidth);
    if (right > limit + 1) out.push(`${table.id || table.className || 'table'}: ends at ${right}, its box at ${limit}`);
  }
  return out;
}"""


@pytest.fixture(scope="module")
def staff(site: Any) -> str:
    site.shell(STAFF)
    return "root"


def test_the_front_page_leads_to_live_usage_and_the_audit_log(chromium: Any, site: Any, staff: str) -> None:
    page = open_page(chromium, site, staff, "/admin/", viewport=SCREEN)
    links = page.locator("#collab-pages a")
    assert links.all_inner_texts() == ["Live now", "Usage", "Audit log"]
    for name, heading in [
        ("Live now", "Live"),
        ("Usage", "Usage: tokens and cost"),
        ("Audit log", "Select audit entry"),
    ]:
        page.goto(f"{site.url}/admin/")
        page.get_by_role("link", name=name, exact=True).first.click()
        page.wait_for_load_state()
        assert page.locator("#content h1").inner_text().startswith(heading), (name, page.url)
        assert page.locator("#content h1").is_visible()
    screenshot(page, "admin-audit-log-1280")


@pytest.mark.parametrize("name", list(PAGES))
def test_no_admin_table_runs_off_its_page(chromium: Any, site: Any, staff: str, name: str) -> None:
    page = open_page(chromium, site, staff, PAGES[name], viewport=SCREEN)
    screenshot(page, f"admin-{name.replace(' ', '-')}-1280")
    assert page.evaluate(OVERFLOWS) == [], name


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("name", ["front page", "rooms", "audit log", "live", "usage"])
def test_axe_finds_nothing_serious_on_admin_pages(chromium: Any, site: Any, staff: str, name: str, scheme: str) -> None:
    page = open_page(chromium, site, staff, PAGES[name], viewport=SCREEN, color_scheme=scheme)
    serious = [v for v in axe_violations(page) if v["impact"] in ("serious", "critical")]
    assert serious == [], "\n".join(
        f"{v['id']} ({v['impact']}): {v['help']}\n  " + "\n  ".join(v["nodes"]) for v in serious
    )
