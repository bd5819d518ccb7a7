"""No page left wrong (docs/architecture.md#a-faults): a socket that saw a reply
streaming and never got its final frame (lost in a channel-layer hiccup shorter than a
heartbeat, which no resync follows) is sent the reply's stored article, without a
reconnect, within two heartbeats of the reply's end.

Each heartbeat (lifecycle.Runtime.beat) looks at what this process's sockets still
expect: a reply with a finite floor (consumers.RoomConsumer.floors) is one the socket
takes pieces of. A reply no process streams any more (its shared record ended or gone,
and not running here) is a suspect; one that is still a suspect at the next beat, and
stored as ended, is sent to the sockets that still expect it, as its `final` frame. A
final that was only late arrives meanwhile and takes the reply off the floors: nothing
is sent twice, and a reply still streaming anywhere is never touched.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

from channels.db import database_sync_to_async

from collab.chat import fanout, frames, metrics, rendering, shared
from collab.chat.events import RoomFrame
from collab.chat.generation import registry
from collab.chat.models import Message

log = logging.getLogger(__name__)


def _expected() -> dict[int, list[fanout.Receiver]]:
    """Reply id -> this process's sockets that expect more of it."""
    expected: dict[int, list[fanout.Receiver]] = {}
    for receiver in fanout.receivers():
        for msg, floor in receiver.floors.items():
            if msg > 0 and floor != math.inf:
                expected.setdefault(msg, []).append(receiver)
    return expected


def _stored_finals(ids: Iterable[int]) -> list[RoomFrame]:
    ended = Message.objects.filter(pk__in=list(ids)).exclude(status=Message.Status.STREAMING)
    return [
        frames.final(m.pk, rendering.frame_final(m), to=m.recipient_id)
        for m in ended.select_related("recipient", "reply_to")
    ]


class Repair:
    def __init__(self) -> None:
        self._suspects: set[int] = set()

    async def check(self) -> int:
        """One heartbeat's look; the number of replies whose final was sent again."""
        expected = _expected()
        running = set(registry.ids())
        ids = [i for i in expected if i not in running]
        views = await shared.backend().read(ids) if ids else {}
        ended = {i for i in ids if (view := views.get(i)) is None or view.ended}
        due, self._suspects = ended & self._suspects, ended - self._suspects
        if not due:
            return 0
        finals = await database_sync_to_async(_stored_finals)(due)
        for frame in finals:
            waiting = [r for r in expected[frame["msg"]] if r.floors.get(frame["msg"], math.inf) != math.inf]
            log.warning("reply %s: its final never reached %d sockets here; sent again", frame["msg"], len(waiting))
            metrics.FINALS_REPAIRED.inc(len(waiting))
            for receiver in waiting:
                receiver.take_frame(frame, None)
        return len(finals)


repair = Repair()
