"""Who may use which assistant (README "Security"; issue 33): staff set each assistant's
availability (`Assistant.available_to`), every room or only the rooms they grant it to.

A room may use an assistant when it is available to every room, or the room is one of
its `granted_rooms`, or the room's owner is in one of its `granted_groups` (Django's
auth groups). The owner, not any member: the owner chooses the room's assistants on its
settings page, and the room spends under their name, so a grant to a group is a grant to
the rooms its members own.

An assistant attached to a room that may not use it is inert: the settings page does not
offer it (a forged form naming it is refused and audited: settings_views.py), a post
that names it is told `assistant.unavailable` and starts nothing, `@all` and "every
message" skip it, and no regeneration, continuation, merge or `/each` runs it
(replies/: every invocation passes `check` when its placeholders are made). It stays
attached, so that staff granting it again restore the room as it was.

The common case costs nothing: an assistant available to every room is known so from
its own row; only granted-only ones are looked up (one query per call).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.db.models import Q, QuerySet

from collab.chat.errors import ClientError
from collab.chat.models import Assistant, Room


def _grant(room: Room) -> Q:
    return Q(granted_rooms=room.pk) | Q(granted_groups__user=room.owner_id)


def attachable(room: Room) -> QuerySet[Assistant]:
    """Every assistant `room` may use (the settings page's choices), by handle."""
    granted = Assistant.objects.filter(_grant(room)).values("pk")
    return Assistant.objects.filter(Q(available_to=Assistant.Availability.EVERYONE) | Q(pk__in=granted))


def available(room: Room, assistants: Iterable[Assistant]) -> list[Assistant]:
    """Those of `assistants` the room may use, in their order."""
    assistants = list(assistants)
    restricted = [a.pk for a in assistants if a.available_to != Assistant.Availability.EVERYONE]
    granted: set[int] = set()
    if restricted:
        granted = set(Assistant.objects.filter(_grant(room), pk__in=restricted).values_list("pk", flat=True))
    return [a for a in assistants if a.available_to == Assistant.Availability.EVERYONE or a.pk in granted]


def unavailable_error(handle: str) -> ClientError:
    return ClientError(
        "assistant.unavailable",
        f"@{handle} is not available in this room (staff have not granted it here); nothing was asked of it.",
    )


def check(room: Room, assistants: Sequence[Assistant]) -> None:
    """Refuse (assistant.unavailable) when the room may not use one of `assistants`."""
    allowed = {a.pk for a in available(room, assistants)}
    for assistant in assistants:
        if assistant.pk not in allowed:
            raise unavailable_error(assistant.handle)
