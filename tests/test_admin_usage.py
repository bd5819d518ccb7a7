"""The admin's usage page: tokens and cost per day by room, user, assistant and provider,
as a table, CSV and a PNG chart, over a date range. Replies with known figures are
stored on known days; the numbers are checked on the page, in the CSV and in the query.
Runs on SQLite, and on PostgreSQL in `make test-postgres` (the same tests: the queries
must be portable)."""

from __future__ import annotations

import csv
import io
import struct
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from collab.chat import usage
from collab.chat.admin.usage import report_csv
from collab.chat.models import Assistant, Membership, Message, Provider, Room

pytestmark = pytest.mark.django_db

URL = "/admin/chat/room/usage/"
D1, D2, D3 = date(2025, 3, 1), date(2025, 3, 2), date(2025, 3, 5)
BEFORE, AFTER = date(2025, 2, 28), date(2025, 3, 6)


@dataclass
class Setup:
    alice: User
    bob: User
    lab: Room
    ops: Room
    gpt: Assistant  # on the provider "cloud"
    tiny: Assistant  # on the provider "local"
    cloud: Provider
    local: Provider


def at(day: date, hour: int = 12, minute: int = 0) -> datetime:
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=UTC)


class Stored:
    """Messages with chosen times (created_at is auto_now_add: set after the insert)."""

    def __init__(self) -> None:
        self.seq: dict[int, int] = {}

    def _next(self, room: Room) -> int:
        self.seq[room.pk] = self.seq.get(room.pk, 0) + 1
        return self.seq[room.pk]

    def ask(self, room: Room, author: User | None, when: datetime, name: str = "") -> Message:
        msg = Message.objects.create(
            room=room,
            seq=self._next(room),
            role=Message.Role.USER,
            author=author,
            author_name=name or (author.username if author else "?"),
            text="question",
        )
        Message.objects.filter(pk=msg.pk).update(created_at=when)
        return msg

    def reply(
        self,
        asked: Message | None,
        assistant: Assistant | None,
        when: datetime,
        prompt: int | None,
        completion: int | None,
        cost: str | None,
        room: Room | None = None,
    ) -> Message:
        room = room or (asked.room if asked else None)
        assert room is not None
        msg = Message.objects.create(
            room=room,
            seq=self._next(room),
            role=Message.Role.ASSISTANT,
            assistant=assistant,
            author_name=assistant.display_name if assistant else "Gone Bot",
            reply_to=asked,
            text="answer",
            prompt_tokens=prompt,
            tokens=completion,
            cost=Decimal(cost) if cost is not None else None,
        )
        Message.objects.filter(pk=msg.pk).update(created_at=when)
        return msg


@pytest.fixture
def setup() -> Setup:
    alice = User.objects.create_user("alice")
    bob = User.objects.create_user("bob")
    cloud = Provider.objects.create(name="cloud", base_url="http://127.0.0.1:9/v1", default_model="big")
    local = Provider.objects.create(name="local", base_url="http://127.0.0.1:9/v1", default_model="small")
    gpt = Assistant.objects.create(handle="gpt", display_name="GPT", provider=cloud)
    tiny = Assistant.objects.create(handle="tiny", display_name="Tiny", provider=local)
    lab = Room.objects.create(name="Lab", slug="lab", owner=alice)
    ops = Room.objects.create(name="Ops", slug="ops", owner=bob)
    for room, user in ((lab, alice), (lab, bob), (ops, bob)):
        Membership.objects.create(room=room, user=user)
    s = Stored()
    # D1: alice asks in lab (gpt and tiny answer); bob asks in ops (gpt answers)
    q = s.ask(lab, alice, at(D1, 9))
    s.reply(q, gpt, at(D1, 9), 100, 20, "0.001000")
    s.reply(q, tiny, at(D1, 9), 50, 10, "0.000000")
    q = s.ask(ops, bob, at(D1, 23, 30))
    s.reply(q, gpt, at(D1, 23, 30), 200, 40, "0.002500")
    # D2: bob asks in lab (gpt); a reply still streaming (no figures yet)
    q = s.ask(lab, bob, at(D2, 0, 30))
    s.reply(q, gpt, at(D2, 0, 30), 300, 60, "0.004000")
    s.reply(q, tiny, at(D2, 0, 31), None, None, None)
    # D3: alice in ops (tiny); a reply to a message whose author's account is gone
    q = s.ask(ops, alice, at(D3, 8))
    s.reply(q, tiny, at(D3, 8), 7, 3, "0.000100")
    q = s.ask(ops, None, at(D3, 9), name="ghost")
    s.reply(q, gpt, at(D3, 9), 1000, 500, "0.050000")
    # outside the range, on either side
    q = s.ask(lab, alice, at(BEFORE, 23, 59))
    s.reply(q, gpt, at(BEFORE, 23, 59), 9999, 9999, "9.000000")
    q = s.ask(lab, alice, at(AFTER, 0, 0))
    s.reply(q, gpt, at(AFTER, 0, 0), 8888, 8888, "8.000000")
    return Setup(alice, bob, lab, ops, gpt, tiny, cloud, local)


@pytest.fixture
def staff() -> Client:
    root = User.objects.create_user("root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(root)
    return client


def get(client: Client, path: str = URL, **query: str) -> Any:
    params = {"from": D1.isoformat(), "to": D3.isoformat(), **query}
    return client.get(path, {k: v for k, v in params.items() if v is not None})


def figures(prompt: int, completion: int, cost: str, replies: int) -> usage.Figures:
    return usage.Figures(prompt, completion, Decimal(cost), replies)


EXPECTED_ROWS = {
    "room": [
        (D1, "lab", figures(150, 30, "0.001000", 2)),
        (D1, "ops", figures(200, 40, "0.002500", 1)),
        (D2, "lab", figures(300, 60, "0.004000", 2)),
        (D3, "ops", figures(1007, 503, "0.050100", 2)),
    ],
    "user": [
        (D1, "alice", figures(150, 30, "0.001000", 2)),
        (D1, "bob", figures(200, 40, "0.002500", 1)),
        (D2, "bob", figures(300, 60, "0.004000", 2)),
        (D3, "alice", figures(7, 3, "0.000100", 1)),
        (D3, "ghost", figures(1000, 500, "0.050000", 1)),
    ],
    "assistant": [
        (D1, "gpt", figures(300, 60, "0.003500", 2)),
        (D1, "tiny", figures(50, 10, "0.000000", 1)),
        (D2, "gpt", figures(300, 60, "0.004000", 1)),
        (D2, "tiny", figures(0, 0, "0", 1)),
        (D3, "gpt", figures(1000, 500, "0.050000", 1)),
        (D3, "tiny", figures(7, 3, "0.000100", 1)),
    ],
    "provider": [
        (D1, "cloud", figures(300, 60, "0.003500", 2)),
        (D1, "local", figures(50, 10, "0.000000", 1)),
        (D2, "cloud", figures(300, 60, "0.004000", 1)),
        (D2, "local", figures(0, 0, "0", 1)),
        (D3, "cloud", figures(1000, 500, "0.050000", 1)),
        (D3, "local", figures(7, 3, "0.000100", 1)),
    ],
    "total": [
        (D1, "all", figures(350, 70, "0.003500", 3)),
        (D2, "all", figures(300, 60, "0.004000", 2)),
        (D3, "all", figures(1007, 503, "0.050100", 2)),
    ],
}


# --- the query --------------------------------------------------------------------------


@pytest.mark.parametrize("group_by", list(usage.GROUPS))
def test_report_rows_per_day_and_group(setup: Setup, group_by: str) -> None:
    with CaptureQueriesContext(connection) as queries:
        report = usage.report(D1, D3, group_by)
    assert len(queries) == 1  # aggregated by the database, not message by message
    assert [(r.day, r.group, r.figures) for r in report.rows] == EXPECTED_ROWS[group_by]
    assert report.total() == figures(1657, 633, "0.057600", 7)


def test_totals_rank_the_most_expensive_first(setup: Setup) -> None:
    totals = usage.report(D1, D3, "room").totals()
    assert [(t.group, t.figures) for t in totals] == [
        ("ops", figures(1207, 543, "0.052600", 3)),
        ("lab", figures(450, 90, "0.005000", 4)),
    ]


def test_the_range_includes_both_days_and_nothing_outside(setup: Setup) -> None:
    assert [r.group for r in usage.report(D2, D2, "room").rows] == ["lab"]
    wide = usage.report(BEFORE, AFTER, "total")
    assert [(r.day, r.figures.cost) for r in wide.rows] == [
        (BEFORE, Decimal("9.000000")),
        (D1, Decimal("0.003500")),
        (D2, Decimal("0.004000")),
        (D3, Decimal("0.050100")),
        (AFTER, Decimal("8.000000")),
    ]
    assert usage.report(date(2025, 3, 3), date(2025, 3, 4), "room").rows == []


def test_days_are_the_site_time_zone_days(setup: Setup, settings: Any) -> None:
    settings.TIME_ZONE = "Europe/Paris"  # UTC+1 in March: 23:30 UTC on D1 is D2 there
    rows = usage.report(D1, D3, "room").rows
    assert [(r.day, r.group, r.figures.replies) for r in rows] == [
        (D1, "lab", 3),  # with the reply of 23:59 UTC the day before
        (D2, "lab", 2),
        (D2, "ops", 1),
        (D3, "ops", 2),
    ]


def test_a_provider_is_the_assistants_current_one(setup: Setup) -> None:
    Assistant.objects.filter(pk=setup.tiny.pk).update(provider=setup.cloud)
    groups = {t.group for t in usage.report(D1, D3, "provider").totals()}
    assert groups == {"cloud"}


def test_replies_of_a_deleted_assistant_or_question(setup: Setup) -> None:
    Message.objects.filter(room=setup.ops, role=Message.Role.USER, author_name="ghost").delete()
    Assistant.objects.filter(pk=setup.tiny.pk).delete()
    by_user = {t.group: t.figures.replies for t in usage.report(D1, D3, "user").totals()}
    assert by_user == {"alice": 3, "bob": 3, "(unknown)": 1}
    by_assistant = {t.group: t.figures.replies for t in usage.report(D1, D3, "assistant").totals()}
    assert by_assistant == {"gpt": 4, "Tiny": 3}  # the name it had
    by_provider = {t.group: t.figures.replies for t in usage.report(D1, D3, "provider").totals()}
    assert by_provider == {"cloud": 4, "(no assistant)": 3}


def test_top_folds_the_smaller_groups_into_other(setup: Setup) -> None:
    groups, cells = usage.report(D1, D3, "user").top(1)
    assert groups == ["ghost", usage.OTHER]
    assert cells[(D1, usage.OTHER)] == figures(350, 70, "0.003500", 3)
    assert cells[(D3, "ghost")] == figures(1000, 500, "0.050000", 1)
    assert cells[(D3, usage.OTHER)] == figures(7, 3, "0.000100", 1)


# --- the page, the CSV, the chart --------------------------------------------------------


def test_the_page_shows_the_totals_and_the_rows(setup: Setup, staff: Client) -> None:
    response = get(staff, group="user")
    assert response.status_code == 200
    html = response.content.decode()
    totals = response.context["totals"]
    assert [(t.group, t.figures) for t in totals] == [
        ("ghost", figures(1000, 500, "0.050000", 1)),
        ("bob", figures(500, 100, "0.006500", 3)),
        ("alice", figures(157, 33, "0.001100", 3)),
    ]
    assert '<tr data-group="ghost">' in html
    assert '<td>ghost</td><td class="num">1</td><td class="num">1000</td>' in html
    assert '<tr data-day="2025-03-02" data-group="bob">' in html
    assert "0.057600" in html  # the total cost
    assert "<h2>Totals by user (who asked), 2025-03-01 to 2025-03-05</h2>" in html
    assert "current</em> provider" in html
    assert f'src="/admin/chat/room/usage.png?from={D1}&amp;to={D3}&amp;group=user"' in html
    assert f'href="/admin/chat/room/usage.csv?from={D1}&amp;to={D3}&amp;group=user"' in html


def test_the_page_defaults_to_the_last_30_days_by_room(setup: Setup, staff: Client) -> None:
    s = Stored()
    s.seq = {setup.lab.pk: 100}
    today = timezone.localdate()
    q = s.ask(setup.lab, setup.alice, timezone.now())
    s.reply(q, setup.gpt, timezone.now(), 11, 22, "0.000333")
    q = s.ask(setup.lab, setup.alice, at(today - timedelta(days=30)))
    s.reply(q, setup.gpt, at(today - timedelta(days=30)), 5, 5, "1.000000")  # 31 days ago: outside
    response = staff.get(URL)
    assert response.status_code == 200
    report = response.context["report"]
    assert (report.start, report.end, report.group_by) == (today - timedelta(days=29), today, "room")
    assert [(r.group, r.figures) for r in report.rows] == [("lab", figures(11, 22, "0.000333", 1))]
    html = response.content.decode()
    assert 'value="room" selected' in html
    assert f'name="from" value="{today - timedelta(days=29)}"' in html
    # the chart and the CSV repeat the range in effect (not "the last 30 days" again, later)
    assert f'src="/admin/chat/room/usage.png?from={today - timedelta(days=29)}&amp;to={today}&amp;group=room"' in html


def test_the_csv_has_the_same_rows(setup: Setup, staff: Client) -> None:
    response = get(staff, URL.rstrip("/") + ".csv", group="assistant")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="collab-usage-assistant-{D1}-{D3}.csv"'
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == ["day", "assistant", "prompt_tokens", "completion_tokens", "cost_usd", "replies"]
    assert rows[1:] == [
        [d.isoformat(), g, str(f.prompt_tokens), str(f.completion_tokens), f"{f.cost:.6f}", str(f.replies)]
        for d, g, f in EXPECTED_ROWS["assistant"]
    ]
    assert rows[1] == ["2025-03-01", "gpt", "300", "60", "0.003500", "2"]
    assert rows[4] == ["2025-03-02", "tiny", "0", "0", "0.000000", "1"]  # still streaming: no figures yet


def test_csv_names_never_run_as_formulas() -> None:
    report = usage.Report(D1, D1, "user", [usage.Row(D1, "=HYPERLINK(1)", usage.Figures(1, 2, Decimal(1), 1))])
    assert report_csv(report).splitlines()[1] == "2025-03-01,'=HYPERLINK(1),1,2,1.000000,1"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def decode(data: bytes) -> Any:
    from matplotlib.image import imread

    return imread(io.BytesIO(data), format="png")


def test_the_chart_is_a_png_with_a_bar_per_group(setup: Setup, staff: Client) -> None:
    response = get(staff, URL.rstrip("/") + ".png", group="provider")
    assert response.status_code == 200
    assert response["Content-Type"] == "image/png"
    data = response.content
    assert png_size(data) == (1000, 600)
    assert 10_000 < len(data) < 1_000_000
    pixels = decode(data)
    assert pixels.shape[:2] == (600, 1000)
    # the bars: the first two colours of the palette (cloud C0 blue, local C1 orange)
    rgb = (pixels[:, :, :3] * 255).round().astype(int).reshape(-1, 3)
    colours = {tuple(c) for c in rgb}
    assert (31, 119, 180) in colours and (255, 127, 14) in colours


def test_the_chart_of_an_empty_range(setup: Setup, staff: Client) -> None:
    response = staff.get(URL.rstrip("/") + ".png", {"from": "2025-03-03", "to": "2025-03-04"})
    assert response.status_code == 200
    assert png_size(response.content) == (1000, 600)
    rgb = (decode(response.content)[:, :, :3] * 255).round().astype(int).reshape(-1, 3)
    assert (31, 119, 180) not in {tuple(c) for c in rgb}


def test_the_chart_folds_beyond_the_top_groups(setup: Setup) -> None:
    from collab.chat.admin.usage import chart_png

    report = usage.report(D1, D3, "user")
    top1 = decode(chart_png(report, top=1))
    rgb = {tuple(c) for c in (top1[:, :, :3] * 255).round().astype(int).reshape(-1, 3)}
    assert (31, 119, 180) in rgb  # ghost, in C0
    assert (153, 153, 153) in rgb  # "(other)": grey 0.6
    assert (255, 127, 14) not in rgb  # no second group colour


# --- bad queries ----------------------------------------------------------------------------


BAD = {
    "a malformed date": ({"from": "2025-13-01"}, "from: Enter a date as YYYY-MM-DD, e.g. 2025-03-01."),
    "a date in another format": ({"to": "03/05/2025"}, "to: Enter a date as YYYY-MM-DD, e.g. 2025-03-01."),
    "the end before the start": (
        {"from": "2025-03-05", "to": "2025-03-01"},
        "__all__: The end date (2025-03-01) is before the start date (2025-03-05).",
    ),
    "more than 366 days": (
        {"from": "2024-01-01", "to": "2025-01-01"},
        "__all__: At most 366 days at once; 2024-01-01 to 2025-01-01 is 367 days.",
    ),
    "an unknown group": (
        {"group": "planet"},
        "group: Select a valid choice. planet is not one of the available choices.",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("suffix", ["/", ".csv", ".png"])
def test_a_bad_query_is_refused_with_its_error(setup: Setup, staff: Client, case: str, suffix: str) -> None:
    query, error = BAD[case]
    with CaptureQueriesContext(connection) as queries:
        response = staff.get(URL.rstrip("/") + suffix, query)
    assert response.status_code == 400
    assert not any("chat_message" in q["sql"] for q in queries.captured_queries)
    text = response.content.decode()
    field, message = error.split(": ", 1)
    if suffix == "/":
        assert message in text
        assert f'data-errors="{"form" if field == "__all__" else field}"' in text
        assert 'id="usage-chart"' not in text
    else:
        assert response["Content-Type"] == "text/plain; charset=utf-8"
        assert text == error + "\n"


def test_366_days_is_allowed(setup: Setup, staff: Client) -> None:
    response = staff.get(URL, {"from": "2024-03-06", "to": "2025-03-06"})
    assert response.status_code == 200
    assert len(response.context["report"].days) == 366


def test_only_from_given_runs_to_today(setup: Setup, staff: Client) -> None:
    start = timezone.localdate() - timedelta(days=3)
    response = staff.get(URL, {"from": start.isoformat()})
    report = response.context["report"]
    assert (report.start, report.end) == (start, timezone.localdate())


# --- who may see it ---------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["/", ".csv", ".png"])
def test_staff_without_the_view_permissions_get_403(setup: Setup, suffix: str) -> None:
    clerk = User.objects.create_user("clerk", is_staff=True)
    clerk.user_permissions.add(Permission.objects.get(codename="view_room"))
    client = Client()
    client.force_login(clerk)
    response = get(client, URL.rstrip("/") + suffix)
    assert response.status_code == 403
    assert b"lab" not in response.content and b"0.0" not in response.content
    clerk.user_permissions.add(Permission.objects.get(codename="view_message"))
    client.force_login(User.objects.get(pk=clerk.pk))
    assert get(client, URL.rstrip("/") + suffix).status_code == 200


def test_only_get(staff: Client) -> None:
    assert staff.post(URL).status_code == 405
