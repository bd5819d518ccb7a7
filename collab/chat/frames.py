"""The server's frames to a room's sockets (docs/wire.md, "Server to client"): one
constructor per kind, so that every frame has the fields its kind needs and no other.

A frame is a `room.frame` event (events.RoomFrame): HTML rendered once by its sender
(rendering.py), plus the few fields a socket reads to decide, without rendering,
whether it takes it (consumers.RoomConsumer.take_frame). broadcast.py sends them.
"""

from __future__ import annotations

from collections.abc import Sequence

from collab.chat.events import RoomFrame


def new(
    msg: int, html: str, replies: Sequence[int] = (), *, to: int | None = None, thread: int | None = None
) -> RoomFrame:
    """Articles that were not there: a message and the replies it starts (each socket
    then expects their pieces from offset 0). `thread`: they are in that thread
    (services/threads.py), which changes nothing of the room's own history."""
    frame: RoomFrame = {"type": "room.frame", "kind": "new", "msg": msg, "replies": list(replies), "html": html}
    if to is not None:
        frame["to"] = to
    if thread is not None:
        frame["thread"] = thread
    return frame


def delta(msg: int, offset: int, text_length: int, html: str, *, to: int | None = None) -> RoomFrame:
    """A piece of a streaming reply (`msg`: its id; a thinking piece's: -id), from
    `offset` on, `text_length` characters long."""
    frame: RoomFrame = {
        "type": "room.frame",
        "kind": "delta",
        "msg": msg,
        "offset": offset,
        "end": offset + text_length,
        "html": html,
    }
    if to is not None:
        frame["to"] = to
    return frame


def final(
    msg: int, html: str, *, to: int | None = None, resume: Sequence[int] | None = None, thread: int | None = None
) -> RoomFrame:
    """A message's article whole, replacing the one shown; `resume`: a reply streaming
    again (continue) takes pieces from these offsets [answer, thinking] on; `thread`: as new's."""
    frame: RoomFrame = {"type": "room.frame", "kind": "final", "msg": msg, "html": html}
    if to is not None:
        frame["to"] = to
    if thread is not None:
        frame["thread"] = thread
    if resume is not None:
        frame["resume"] = list(resume)
    return frame


def other(
    html: str,
    *,
    msg: int | None = None,
    to: int | None = None,
    by: str = "",
    not_user: int | None = None,
    ephemeral: bool = False,
) -> RoomFrame:
    """Anything else (member list, votes, status, a label): no order to keep. `by`: the
    socket whose own change it announces (it already shows it); `not_user`: a user whose
    own sockets skip it (their own typing); `ephemeral`: it tells of nothing stored (who
    is online, who is typing), so a snapshot read before it is still current (fanout.stamp)."""
    frame: RoomFrame = {"type": "room.frame", "kind": "other", "html": html}
    if ephemeral:
        frame["ephemeral"] = True
    if msg is not None:
        frame["msg"] = msg
    if to is not None:
        frame["to"] = to
    if by:
        frame["by"] = by
    if not_user is not None:
        frame["not_user"] = not_user
    return frame
