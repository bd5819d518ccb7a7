"""What every member's snapshot of a room shares, read once per room and reused by every
socket that (re)connects to it while nothing has changed (docs/architecture.md#a-connects).

After a restart or an outage every socket of a room asks for its snapshot at once; each
read took the database thread for several queries (the room's recent messages, its
streaming thread replies, its members, panels, status and name) though all but a
member's personal replies are the same for everyone. Here the shared part is read once
and kept with the room's hub (collab/chat/fanout.py) at the hub's stamp: any event other
than a piece that reaches the room on this process moves the stamp and the part is read
again. A change is committed before its frame is sent, so a part read at stamp S lacks
only changes whose frames had not yet reached this process at S: they reach every socket
that joined the room, which holds them until its snapshot is out (consumers.py).

Readers that ask at the same stamp while it is being read wait for that one read. A
member's personal replies are never here: each socket reads its own (services/snapshot.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from channels.db import database_sync_to_async
from django.conf import settings

from collab.chat import attached, fanout, metrics, room_frames
from collab.chat.models import Message, Room
from collab.chat.services import panels, threads
from collab.chat.services.rooms import MemberRow, member_rows


@dataclass(frozen=True)
class RoomView:
    """A room as every member sees it (shared messages only)."""

    recent: list[Message]  # the newest HISTORY_MESSAGES + 1 top-level messages, in seq order
    thread_live: list[Message]  # its streaming thread replies (threads.live_replies)
    members: list[MemberRow]
    panels_html: str  # the same for every member (services/panels.py)
    header_html: str  # the room's status and name as they are now
    # Who has any personal reply in the room: only they read theirs (services/snapshot.py).
    # A new recipient's first replies are stored with their question, whose frame moves
    # the stamp (replies/each.py): no recipient is missing from a current part.
    recipients: frozenset[int]
    # The shared messages' articles as the snapshots render them (rendering.fit's memo):
    # rendered by the first snapshot that shows each, then reused while the part is current.
    articles: dict[tuple[object, ...], str] = field(default_factory=dict)


def read(room_id: int) -> RoomView:
    """The room's shared part, read now (database thread)."""
    limit = settings.COLLAB["HISTORY_MESSAGES"]
    qs = Message.objects.filter(room_id=room_id, version_hidden=False, thread__isnull=True).shared()
    recent = list(attached.with_files(qs.select_related("recipient")).order_by("-seq")[: limit + 1])[::-1]
    row = Room.objects.filter(pk=room_id).values_list("status", "name").first()
    # The room's status and name as they are now: a page that missed their frames catches up.
    header = room_frames.room_status(row[0]) + room_frames.room_name(row[1]) if row else room_frames.room_status("open")
    return RoomView(
        recent,
        threads.live_replies(room_id),
        member_rows(room_id),
        panels.render_all(room_id, None, True),
        header,
        frozenset(
            Message.objects.filter(room_id=room_id, recipient__isnull=False)
            .order_by()
            .values_list("recipient_id", flat=True)
            .distinct()
        ),
    )


def current(room_id: int) -> RoomView | None:
    """The room's shared part if one is kept and still current (never read here)."""
    at = fanout.stamp(room_id)
    pending = fanout.kept(room_id, at) if at is not None else None
    if pending is None or not pending.done() or pending.cancelled() or pending.exception() is not None:
        return None
    return pending.result()  # type: ignore[no-any-return]


async def room_view(room_id: int) -> RoomView:
    """The room's shared part: kept, while the room's stamp has not moved, or read now."""
    at = fanout.stamp(room_id)
    if at is None:  # no hub here (a socket joins one before its snapshot): nothing is kept
        return await database_sync_to_async(read)(room_id)
    pending = fanout.kept(room_id, at)
    if pending is not None:
        metrics.SNAPSHOT_READS.labels("shared").inc()
        return await asyncio.shield(pending)  # type: ignore[no-any-return]
    metrics.SNAPSHOT_READS.labels("read").inc()
    future: asyncio.Future[RoomView] = asyncio.get_running_loop().create_future()
    fanout.keep(room_id, at, future)
    try:
        view = await database_sync_to_async(read)(room_id)
    except BaseException as exc:
        fanout.keep(room_id, at, None)  # not kept: the next reader tries again
        if isinstance(exc, asyncio.CancelledError):
            future.cancel()
        else:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody waited
        raise
    future.set_result(view)
    return view
