"""A room's monthly budget, in tokens or in cost (docs/wire.md, "budgets").

The month is the calendar month in UTC: what the room's messages created since its first
instant used (prompt plus reply tokens, and `Message.cost`) counts against
`Room.budget_tokens` and `Room.budget_cost`. Both blank: the deployment's default budget
(COLLAB_DEFAULT_ROOM_BUDGET_TOKENS and _COST, README "Security"), so that no room, a
self-made one included, spends the deployment's provider money without limit; none when
those are unset either. Once either is spent,
an invocation (a post that would start replies, a regeneration, a continuation, `/each`)
is refused with `room.budget` and the date it resets, before any reply is stored or any
provider called. Replies already running finish (a budget may end a little overspent).

The check is one aggregate query (`usage`); the room header's figure (`#budget`) is sent
again after each reply ends (`announce`), and when staff change the budget.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

from channels.db import database_sync_to_async
from django.conf import settings
from django.db.models import DecimalField, F, IntegerField, Q, Sum, Value
from django.db.models.functions import Coalesce
from django.template.loader import render_to_string
from django.utils import timezone

from collab.chat import broadcast, frames
from collab.chat.errors import ClientError
from collab.chat.events import RoomFrame
from collab.chat.models import Message, Room, RoomDefaults
from collab.chat.services import moderation

log = logging.getLogger(__name__)

_MONEY: DecimalField[Decimal, Decimal] = DecimalField(max_digits=16, decimal_places=6)


def month_start(now: datetime | None = None) -> datetime:
    """The first instant of this calendar month, in UTC."""
    now = (now or timezone.now()).astimezone(UTC)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def resets_on(now: datetime | None = None) -> date:
    """The first day of next month (UTC): when a spent budget is whole again."""
    start = month_start(now)
    return date(start.year + (start.month == 12), start.month % 12 + 1, 1)


@dataclass(frozen=True)
class Budget:
    """A room's budget and what this month used of it; a limit of None: no limit."""

    tokens: int | None
    cost: Decimal | None
    used_tokens: int
    used_cost: Decimal
    resets: date
    default: bool = False  # the deployment's default budget: the room has none of its own

    @property
    def limited(self) -> bool:
        return self.tokens is not None or self.cost is not None

    @property
    def tokens_left(self) -> int | None:
        return None if self.tokens is None else max(0, self.tokens - self.used_tokens)

    @property
    def cost_left(self) -> Decimal | None:
        return None if self.cost is None else max(Decimal(0), self.cost - self.used_cost)

    @property
    def spent(self) -> bool:
        return (self.tokens is not None and self.used_tokens >= self.tokens) or (
            self.cost is not None and self.used_cost >= self.cost
        )


# The staff's default (the admin's "Room defaults"), read at most this often per process:
# a change applies everywhere within it, with no query per post.
DEFAULTS_TTL_S = 5.0
_defaults: tuple[float, int | None, Decimal | None] = (-math.inf, None, None)


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def deployment_default() -> tuple[int | None, Decimal | None]:
    """The default monthly limits of a room without its own: the staff's (the admin's Room
    defaults), else the environment's (COLLAB_DEFAULT_ROOM_BUDGET_*). Read again once
    DEFAULTS_TTL_S old, never from the event loop's thread (there, the last read is used)."""
    global _defaults
    now = time.monotonic()
    if now >= _defaults[0] and not _in_event_loop():
        row = RoomDefaults.objects.filter(pk=1).values_list("budget_tokens", "budget_cost").first()
        tokens, cost = row if row is not None else (None, None)
        _defaults = (now + DEFAULTS_TTL_S, tokens, cost)
    _, tokens, cost = _defaults
    if tokens is None and cost is None:
        return settings.COLLAB_DEFAULT_ROOM_BUDGET_TOKENS, settings.COLLAB_DEFAULT_ROOM_BUDGET_COST
    return tokens, cost


def forget_default(known_none: bool = False) -> None:
    """Read the staff's default again at the next check (this process: the admin's save);
    `known_none`: there is none, as a fresh database has (tests start so, as a process
    does once it has read it)."""
    global _defaults
    _defaults = (time.monotonic() + DEFAULTS_TTL_S, None, None) if known_none else (-math.inf, None, None)


def limits(room: Room) -> tuple[int | None, Decimal | None, bool]:
    """The room's monthly limits in tokens and cost, and whether they are the deployment's
    default (the room has none of its own)."""
    if room.budget_tokens is not None or room.budget_cost is not None:
        return room.budget_tokens, room.budget_cost, False
    tokens, cost = deployment_default()
    return tokens, cost, tokens is not None or cost is not None


def unlimited(room: Room) -> bool:
    """No budget at all: none of its own and no default (its use is not read)."""
    tokens, cost, _ = limits(room)
    return tokens is None and cost is None


def usage(room: Room, now: datetime | None = None) -> Budget:
    """`room`'s budget as of now: one aggregate query, none when it has no budget."""
    resets = resets_on(now)
    tokens, cost, default = limits(room)
    if tokens is None and cost is None:
        return Budget(None, None, 0, Decimal(0), resets)
    # A reply continued this month counts whole (its row holds both requests' usage).
    since = month_start(now)
    this_month = Q(created_at__gte=since) | Q(finished_at__gte=since)
    used = Message.objects.filter(this_month, room_id=room.pk).aggregate(
        tokens=Coalesce(
            Sum(Coalesce(F("prompt_tokens"), 0) + Coalesce(F("tokens"), 0), output_field=IntegerField()), 0
        ),
        cost=Coalesce(Sum("cost", output_field=_MONEY), Value(Decimal(0)), output_field=_MONEY),
    )
    return Budget(tokens, cost, int(used["tokens"]), Decimal(used["cost"]), resets, default)


def check(room: Room) -> None:
    """Refuse an invocation once the room's monthly budget is spent (room.budget). Asked
    once per Room instance (one action's: a post checks before it stores anything, and
    its placeholders do not ask again)."""
    if getattr(room, "_budget_checked", False):
        return
    budget = usage(room)
    if not budget.spent:
        room._budget_checked = True  # type: ignore[attr-defined]
        return
    raise ClientError(
        "room.budget",
        f"This room's monthly budget{' (the deployment default)' if budget.default else ''} is spent: no "
        f"assistant can reply until it resets on {budget.resets.isoformat()} (UTC). Staff can raise it.",
    )


def render(budget: Budget, oob: bool = True) -> str:
    """The room header's `<span id="budget">` (empty when the room has no budget)."""
    return render_to_string("chat/_budget.html", {"budget": budget, "oob": oob})


def _frame(room_id: int) -> RoomFrame | None:
    room = Room.objects.filter(pk=room_id).only("budget_tokens", "budget_cost").first()
    if room is None:
        return None
    budget = usage(room)
    if not budget.limited:
        return None
    return frames.other(render(budget))


async def announce(room_id: int, unlimited: bool = False) -> None:
    """What is left, to the room's sockets (after a reply ends). A room without a budget:
    no frame; `unlimited`: the caller knows it has none (replies/early.py: its row is
    forgotten whenever a room is saved, a budget set among it), so nothing is read. Never
    fails its caller."""
    if unlimited:
        return
    try:
        frame = await database_sync_to_async(_frame)(room_id)
        if frame is not None:
            await broadcast.to_room(room_id, frame)
    except Exception:
        log.warning("could not announce room %s's budget", room_id, exc_info=True)


def announce_on_commit(room: Room) -> None:
    """After staff change a budget: the header shows it (even when it is now unlimited)."""
    broadcast.after_commit(room.pk, frames.other(render(usage(room))))


def _shown(value: object) -> str:
    return "none" if value is None else str(value)


def staff_changed(actor: moderation.Actor, room: Room, before: dict[str, object]) -> None:
    """Staff changed the room's budget (the admin's room form): one audit row, inside the
    form's transaction, and the header updated once it commits."""
    detail = "; ".join(
        f"{label} {_shown(before.get(field))} -> {_shown(getattr(room, field))}"
        for field, label in (("budget_tokens", "tokens"), ("budget_cost", "cost"))
        if before.get(field) != getattr(room, field)
    )
    moderation.record(actor, "budget", room, detail=detail)
    announce_on_commit(room)
