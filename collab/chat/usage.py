"""Usage: what the assistants' replies consumed, per day and per group (room, the user
who asked, assistant, provider), for the admin's usage page (admin/usage.py).

One query per report, aggregated by the database (TruncDate + values + Sum: portable
between SQLite and PostgreSQL): rows of (day, group, prompt tokens, completion tokens,
cost, replies), never the messages themselves. Days are calendar days in the site's time
zone (TIME_ZONE); a reply counts on the day it was created.

The groups:
- room: the room's slug;
- user: who asked, the author of the message the reply answered (their name at the time
  if the account is gone; "(unknown)" if that message is gone);
- assistant: the assistant's handle (its name at the time if it is gone);
- provider: the assistant's *current* provider: an assistant moved to another provider
  takes its past replies along ("(no assistant)" if the assistant is gone);
- total: one group, "all".
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import CharField, Count, DecimalField, F, IntegerField, Sum, Value
from django.db.models.functions import Coalesce, TruncDate
from django.utils import timezone

from collab.chat.models import Message

MAX_DAYS = 366
OTHER = "(other)"  # the groups folded together beyond the top N: no slug, username or handle has parentheses

GROUPS: dict[str, str] = {
    "room": "room",
    "user": "user (who asked)",
    "assistant": "assistant",
    "provider": "provider (the assistant's current one)",
    "total": "nothing (all replies together)",
}

_TEXT: CharField[str, str] = CharField()
_MONEY: DecimalField[Decimal, Decimal] = DecimalField(max_digits=20, decimal_places=6)


def _group_expression(group_by: str) -> Any:
    if group_by == "room":
        return F("room__slug")
    if group_by == "user":
        return Coalesce("reply_to__author__username", "reply_to__author_name", Value("(unknown)"), output_field=_TEXT)
    if group_by == "assistant":
        return Coalesce("assistant__handle", "author_name", output_field=_TEXT)
    if group_by == "provider":
        return Coalesce("assistant__provider__name", Value("(no assistant)"), output_field=_TEXT)
    if group_by == "total":
        return Value("all", output_field=_TEXT)
    raise ValueError(f"unknown group {group_by!r}: one of {', '.join(GROUPS)}")


@dataclass(frozen=True)
class Figures:
    """Tokens and cost of some replies."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: Decimal = Decimal(0)
    replies: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cost_usd(self) -> str:
        """The cost to the micro-dollar, written the same way whatever the database."""
        return f"{self.cost:.6f}"

    def __add__(self, other: Figures) -> Figures:
        return Figures(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cost + other.cost,
            self.replies + other.replies,
        )


@dataclass(frozen=True)
class Row:
    day: date
    group: str
    figures: Figures


@dataclass(frozen=True)
class Total:
    group: str
    figures: Figures


@dataclass(frozen=True)
class Report:
    start: date
    end: date  # inclusive
    group_by: str
    rows: list[Row]  # by day, then group

    @property
    def days(self) -> list[date]:
        """Every day of the range, those without a reply included."""
        return [self.start + timedelta(days=i) for i in range((self.end - self.start).days + 1)]

    def totals(self) -> list[Total]:
        """Each group over the whole range, the most expensive first (then the most tokens)."""
        sums: dict[str, Figures] = defaultdict(Figures)
        for row in self.rows:
            sums[row.group] += row.figures
        ranked = sorted(sums.items(), key=lambda kv: (-kv[1].cost, -kv[1].tokens, kv[0]))
        return [Total(group, figures) for group, figures in ranked]

    def total(self) -> Figures:
        return sum((row.figures for row in self.rows), Figures())

    def top(self, n: int) -> tuple[list[str], dict[tuple[date, str], Figures]]:
        """The n biggest groups (and OTHER for the rest, if any), and each day's figures per
        group so folded: what the chart draws."""
        groups = [t.group for t in self.totals()]
        kept = set(groups[:n])
        folded: dict[tuple[date, str], Figures] = defaultdict(Figures)
        for row in self.rows:
            folded[(row.day, row.group if row.group in kept else OTHER)] += row.figures
        return groups[:n] + ([OTHER] if len(groups) > n else []), dict(folded)


def day_start(day: date) -> datetime:
    """The first instant of `day` in the site's time zone."""
    return timezone.make_aware(datetime.combine(day, time.min))


def report(start: date, end: date, group_by: str) -> Report:
    """The replies created from `start` to `end` (both included), per day and group: one query."""
    if end < start:
        raise ValueError("the end is before the start")
    if (end - start).days + 1 > MAX_DAYS:
        raise ValueError(f"at most {MAX_DAYS} days at once")
    replies = Message.objects.filter(
        role=Message.Role.ASSISTANT,
        created_at__gte=day_start(start),
        created_at__lt=day_start(end + timedelta(days=1)),
    )
    query = (
        replies.annotate(day=TruncDate("created_at"), group=_group_expression(group_by))
        .values("day", "group")
        .annotate(
            prompt=Coalesce(Sum("prompt_tokens"), Value(0), output_field=IntegerField()),
            completion=Coalesce(Sum("tokens"), Value(0), output_field=IntegerField()),
            money=Coalesce(Sum("cost"), Value(Decimal(0)), output_field=_MONEY),
            n=Count("pk"),
        )
        .order_by("day", "group")
    )
    rows = [
        Row(r["day"], r["group"], Figures(int(r["prompt"]), int(r["completion"]), Decimal(r["money"]), int(r["n"])))
        for r in query
    ]
    return Report(start, end, group_by, rows)
