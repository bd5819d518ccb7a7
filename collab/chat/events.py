"""Channel-layer group names and the events sent through them.

Every event a room's sockets receive is a `room.frame`: HTML rendered once by the
sender, plus the few fields a consumer needs to decide, without rendering, whether
this member should get it (see consumers.RoomConsumer.take_frame). Control events go
to every server process (lifecycle.py), which acts on the replies it runs.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

FrameKind = Literal["new", "delta", "final", "other"]

PROCESSES_GROUP = "collab.processes"  # every server process's control channel


def room_group(room_id: int) -> str:
    return f"room.{room_id}"


def member_group(room_id: int, user_id: int) -> str:
    """One member's sockets in one room, on every process: where a personal reply's
    frames go until it is shared (docs/architecture.md#a-personal-replies)."""
    return f"room.{room_id}.user.{user_id}"


def user_group(user_id: int) -> str:
    """Every socket of one user, across rooms and processes (closed on leave/kick)."""
    return f"user.{user_id}"


class RoomFrame(TypedDict):
    type: Literal["room.frame"]
    html: str
    kind: FrameKind
    msg: NotRequired[int]  # message id, for new/delta/final; a thinking delta's: -id (a floor of its own)
    offset: NotRequired[int]  # delta: where the piece starts in the reply's text
    end: NotRequired[int]  # delta: where it ends (a member whose next expected offset is lower missed a piece)
    replies: NotRequired[list[int]]  # new: the replies it announces (each socket expects their pieces from 0)
    resume: NotRequired[list[int]]  # final of a reply streaming again (continue): [answer, thinking] offsets
    by: NotRequired[str]  # the socket whose own change this announces: it already knows
    not_user: NotRequired[int]  # a frame without `msg` that this user's own sockets skip (typing)
    ephemeral: NotRequired[bool]  # tells of nothing stored (presence, typing): frames.other
    to: NotRequired[int]  # a personal reply's recipient: sent to their member_group only (broadcast.py)
    thread: NotRequired[int]  # a thread's message (services/threads.py): no change to the room's history


class MembershipEnded(TypedDict):
    type: Literal["membership.ended"]
    room_id: int
    reason: str


class SessionEnded(TypedDict):
    """The user logged out of this session: its sockets close."""

    type: Literal["session.ended"]
    session_key: str


class AccountChanged(TypedDict):
    """The user was deactivated or deleted, or their password changed: each of their sockets
    checks its session against the account as stored and closes if it no longer holds."""

    type: Literal["account.changed"]


class UnreadItem(TypedDict):
    seq: int
    author: int  # the author's user id; 0: an assistant's reply
    to: int  # a personal reply's recipient; 0: everyone sees it
    mentions: list[str]  # the usernames it @mentions (lower case)


class UnreadActivity(TypedDict):
    """To a room's activity group (`activity_group`): messages new in it, a post and the
    replies it starts (services/unread.py). Once per post, never per piece."""

    type: Literal["unread.activity"]
    room_id: int
    items: list[UnreadItem]


class UnreadRead(TypedDict):
    """To one user's sockets: they read a room up to `read` (its seqs counted up to `last`)."""

    type: Literal["unread.read"]
    room_id: int
    read: int
    last: int
    count: int
    mentioned: bool


def activity_group(room_id: int) -> str:
    """Every socket of every member of a room, on every process, whatever room it has open
    (each socket joins the groups of its user's rooms: the sidebar, services/unread.py)."""
    return f"room.{room_id}.activity"


UserEvent = MembershipEnded | SessionEnded | AccountChanged | UnreadRead


class RoomClosed(TypedDict):
    """To a room's sockets: staff or the owner closed it now; each is told, then closes (4403)."""

    type: Literal["room.closed"]
    room_id: int
    reason: str


class ReplyStop(TypedDict):
    """Stop a reply, on whichever process runs it."""

    type: Literal["reply.stop"]
    message_id: int
    reason: str  # stopped | interrupted


class ReplySteer(TypedDict):
    """A member's note for a streaming reply, to whichever process runs it (replies/steering.py)."""

    type: Literal["reply.steer"]
    message_id: int
    by: str  # the member's username
    text: str  # the note, checked
    channel: str  # the member's socket: told when the reply could not take it


class RoomStopAll(TypedDict):
    """Stop every reply of a room, on every process."""

    type: Literal["room.stop_all"]
    room_id: int


class ProcessPing(TypedDict):
    """A process's note to itself through the layer: it arrives once the process's
    subscriptions are back after the layer was away (lifecycle.Runtime)."""

    type: Literal["process.ping"]
    process: str


class ContextChanged(TypedDict):
    """What replies' context is built from changed without a frame (a room's settings, an
    assistant, a provider): every process forgets what it knew (chat/replies/early.py)."""

    type: Literal["context.changed"]
    room_id: int | None  # None: any room (an assistant or a provider changed)


Control = ReplyStop | ReplySteer | RoomStopAll | ProcessPing | ContextChanged


class SocketResync(TypedDict):
    """To one socket: frames may have been lost (the layer was away); send the room's
    snapshot again."""

    type: Literal["room.resync"]
