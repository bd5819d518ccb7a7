"""Unread, per member and room (docs/architecture.md#a-unread; docs/wire.md, "read"):
`Membership.read_seq` is the seq the member has read up to, kept on the server so that
every device and process agrees. A message is unread for a member when its seq is above
it, it is not deleted, not a hidden version, not the member's own, and the member sees
it (shared, or a personal reply made for them: `visible_to`). A room "mentions" the
member when one of those holds `@USERNAME`.

Live, off the streaming path: when a post is stored (with its reply placeholders), or a
reply is asked again or merged, ONE small `unread.activity` event goes to the room's
activity group (`activity_group`), which every socket of every member joins for each of
its user's rooms (`Tracker`). Each socket counts it in memory and sends its page one
sidebar entry. Reading (`mark_read`) sends one `unread.read` event with the exact count
to the reader's user group (every tab, every process). No event per piece or per final.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from dataclasses import dataclass, field

from channels.db import database_sync_to_async
from django.db import connection
from django.db.models import Q
from django.urls import reverse
from django.utils.html import escape

from collab.chat import broadcast
from collab.chat.errors import ClientError
from collab.chat.events import UnreadActivity as Activity
from collab.chat.events import UnreadItem as Item
from collab.chat.events import UnreadRead as Read
from collab.chat.events import activity_group
from collab.chat.models import Membership, Message, Room

log = logging.getLogger(__name__)

NAV_ROOMS = 100  # rooms listed in the sidebar (and tracked per socket): bounded
MAX_MENTIONS = 20  # usernames an activity event carries
EVENTS = ("unread.activity", "unread.read")  # what a socket hands to its Sidebar
MENTION_SCAN = 500  # unread messages holding "@name" looked at per summary (the mark)
PERSON_RE = re.compile(r"(?<![\w@])@([\w.@+-]{1,150})")


def mentions_of(text: str) -> list[str]:
    """The usernames a text @mentions (a trailing dot is punctuation), lower case, at most MAX_MENTIONS."""
    found: list[str] = []
    for name in PERSON_RE.findall(text):
        name = name.rstrip(".").lower()
        if name and name not in found:
            found.append(name)
            if len(found) == MAX_MENTIONS:
                break
    return found


def mentions_user(text: str, username: str) -> bool:
    return username.lower() in mentions_of(text)


def activity(room_id: int, messages: list[Message]) -> Activity:
    items: list[Item] = [
        {
            "seq": m.seq,
            "author": m.author_id or 0,
            "to": m.recipient_id or 0,
            "mentions": mentions_of(m.text) if m.role == Message.Role.USER else [],
        }
        for m in messages
    ]
    return {"type": "unread.activity", "room_id": room_id, "items": items}


# --- what is unread (database thread) --------------------------------------------------------


@dataclass(slots=True)  # one per room in every socket's sidebar (Tracker)
class RoomUnread:
    room_id: int
    slug: str
    name: str
    read: int  # read up to
    last: int  # the room's seqs counted up to (its last_seq when read)
    count: int = 0
    mentioned: bool = False
    notify: str = Membership.Notify.MENTIONS


def _unread(user_id: int) -> Q:
    return Q(deleted_at__isnull=True, version_hidden=False) & (Q(recipient__isnull=True) | Q(recipient_id=user_id))


@functools.cache
def _summary_sql(vendor: str) -> tuple[str, str, str]:
    """The queries of `summary` and `room_ids`, as SQL (made once per database vendor):
    every socket's connect runs them, and the ORM took longer to compose them than the
    database to answer (docs/architecture.md#a-connects). Their filter is `_unread`'s,
    which the tests hold them to."""
    q = connection.ops.quote_name
    msg, member, room = (q(m._meta.db_table) for m in (Message, Membership, Room))
    unread = (
        f"x.{q('room_id')} = m.{q('room_id')} AND x.{q('seq')} > m.{q('read_seq')}"
        f" AND x.{q('deleted_at')} IS NULL AND NOT x.{q('version_hidden')}"
        f" AND (x.{q('recipient_id')} IS NULL OR x.{q('recipient_id')} = m.{q('user_id')})"
        f" AND (x.{q('author_id')} IS NULL OR x.{q('author_id')} <> m.{q('user_id')})"
    )
    # The member's rooms in the sidebar's order (not archived, NAV_ROOMS at most).
    theirs = (
        f" FROM {member} m JOIN {room} r ON r.{q('id')} = m.{q('room_id')}"
        f" WHERE m.{q('user_id')} = %s AND r.{q('status')} <> %s"
        f" ORDER BY r.{q('name')}, m.{q('room_id')} LIMIT {NAV_ROOMS}"
    )
    rooms = (
        f"SELECT m.{q('room_id')}, r.{q('slug')}, r.{q('name')}, m.{q('read_seq')}, r.{q('last_seq')},"
        f" m.{q('notify')}, CASE WHEN r.{q('last_seq')} > m.{q('read_seq')}"
        f" THEN (SELECT COUNT(*) FROM {msg} x WHERE {unread}) ELSE 0 END" + theirs
    )
    # A mention is a person's (as the live count's, `activity`): an assistant's text is not
    # scanned. LOWER ... LIKE finds candidates; mentions_user decides.
    mentions = (
        f"SELECT x.{q('room_id')}, x.{q('text')} FROM {msg} x JOIN {member} m"
        f" ON m.{q('room_id')} = x.{q('room_id')} AND m.{q('user_id')} = %s"
        f" WHERE {unread} AND x.{q('role')} = %s AND LOWER(x.{q('text')}) LIKE %s ESCAPE '!'"
        f" AND x.{q('room_id')} IN ({{rooms}}) LIMIT {MENTION_SCAN}"
    )
    return rooms, mentions, f"SELECT m.{q('room_id')}" + theirs


def summary(user_id: int, username: str) -> list[RoomUnread]:
    """The member's rooms (not archived; NAV_ROOMS at most, by name), each with its
    unread count and mention mark: one query, and a second only when some room has
    unread messages."""
    rooms_sql, mentions_sql, _ids = _summary_sql(connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(rooms_sql, [user_id, Room.Status.ARCHIVED])
        rooms = {
            row[0]: RoomUnread(row[0], row[1], row[2], row[3], row[4], count=row[6], notify=row[5])
            for row in cursor.fetchall()
        }
        counted = [r.room_id for r in rooms.values() if r.count]
        if counted:
            name = username.lower().replace("!", "!!").replace("%", "!%").replace("_", "!_")
            sql = mentions_sql.format(rooms=", ".join(["%s"] * len(counted)))
            cursor.execute(sql, [user_id, Message.Role.USER, f"%@{name}%", *counted])
            for room_id, text in cursor.fetchall():
                if mentions_user(text, username):
                    rooms[room_id].mentioned = True
    return list(rooms.values())


def room_state(membership: Membership, read: int, last: int) -> RoomUnread:
    """One room's count and mark after reading up to `read`."""
    room = membership.room
    state = RoomUnread(room.pk, room.slug, room.name, read, last, notify=membership.notify)
    if read >= last:
        return state  # nothing above: no query
    user = membership.user
    unread = Message.objects.filter(_unread(user.pk), room_id=room.pk, seq__gt=read).exclude(author_id=user.pk)
    state.count = unread.count()
    username = user.get_username()
    people = unread.filter(role=Message.Role.USER, text__icontains="@" + username)  # as summary's
    texts = people.values_list("text", flat=True)[:MENTION_SCAN]
    state.mentioned = any(mentions_user(t, username) for t in texts)
    return state


def mark_read(membership: Membership, seq: int | None) -> tuple[bool, RoomUnread]:
    """Read up to `seq` (None: all of it), never back: (whether it moved, the room's state)."""
    last = Room.objects.filter(pk=membership.room_id).values_list("last_seq", flat=True).get()
    if seq is None:
        seq = last
    elif seq > last:
        raise ClientError("read.beyond_last", f"This room has no message #{seq} yet (its last is #{last}).")
    moved = Membership.objects.filter(pk=membership.pk, read_seq__lt=seq).update(read_seq=seq) == 1
    read = seq if moved else Membership.objects.filter(pk=membership.pk).values_list("read_seq", flat=True).get()
    return moved, room_state(membership, read, last)


def read_event(state: RoomUnread) -> Read:
    return {
        "type": "unread.read",
        "room_id": state.room_id,
        "read": state.read,
        "last": state.last,
        "count": state.count,
        "mentioned": state.mentioned,
    }


def set_notify(membership: Membership, level: object) -> str:
    if not isinstance(level, str) or level not in Membership.Notify.values:
        raise ClientError("notify.invalid", "Notify must be one of: all, mentions, none.")
    Membership.objects.filter(pk=membership.pk).update(notify=level)
    return level


# --- the sidebar ----------------------------------------------------------------------------


def entry_html(r: RoomUnread, current: int | None, oob: bool = False) -> str:
    """One room of the sidebar: `<li id="nav-room-R" data-unread="N" data-mention="1">`."""
    here = ' aria-current="page"' if r.room_id == current else ""
    swap = ' hx-swap-oob="true"' if oob else ""
    badge = (
        f'<span class="unread" data-count="{r.count}">{r.count}<span class="visually-hidden"> unread</span></span>'
        if r.count
        else ""
    )
    mark = (
        '<span class="mentioned" title="You were mentioned">@<span class="visually-hidden"> mentioned you</span></span>'
        if r.mentioned and r.count
        else ""
    )
    return (
        f'<li id="nav-room-{r.room_id}" class="nav-room" data-room="{r.room_id}" data-unread="{r.count}"'
        f' data-mention="{1 if r.mentioned and r.count else ""}" data-notify="{r.notify}"{swap}>'
        f'<a href="{reverse("room", args=[r.slug])}"{here}>{escape(r.name)}</a>{badge}{mark}</li>'
    )


def list_html(rooms: list[RoomUnread], current: int | None, oob: bool = False) -> str:
    swap = ' hx-swap-oob="true"' if oob else ""
    items = "".join(entry_html(r, current) for r in rooms)
    return f'<ul id="rooms-list" class="rooms-list"{swap}>{items}</ul>'


# --- one socket's view of its user's rooms (in memory) ---------------------------------------


@dataclass(slots=True)
class Tracker:
    """What one socket's sidebar shows, kept current from the events (no database)."""

    user_id: int
    username: str
    current: int  # the room this socket has open
    rooms: dict[int, RoomUnread] = field(default_factory=dict)

    @classmethod
    def load(cls, user_id: int, username: str, current: int) -> Tracker:
        return cls(user_id, username.lower(), current, {r.room_id: r for r in summary(user_id, username)})

    def html(self) -> str:
        return list_html(list(self.rooms.values()), self.current, oob=True)

    def on_activity(self, event: Activity) -> str | None:
        r = self.rooms.get(event["room_id"])
        if r is None:
            return None
        changed = False
        for item in event["items"]:
            seq = item["seq"]
            if seq <= r.last:  # already counted (the summary read it, or a read event)
                continue
            r.last = seq
            if seq <= r.read or item["author"] == self.user_id or item["to"] not in (0, self.user_id):
                continue
            r.count += 1
            r.mentioned = r.mentioned or self.username in item["mentions"]
            changed = True
        return entry_html(r, self.current, oob=True) if changed else None

    def on_read(self, event: Read) -> str | None:
        r = self.rooms.get(event["room_id"])
        if r is None or event["read"] < r.read:
            return None
        r.read, r.last = event["read"], max(r.last, event["last"])
        r.count, r.mentioned = event["count"], event["mentioned"]
        return entry_html(r, self.current, oob=True)

    def forget(self, room_id: int) -> str | None:
        """A membership ended: its room leaves the sidebar."""
        if self.rooms.pop(room_id, None) is None:
            return None
        return f'<li id="nav-room-{room_id}" hx-swap-oob="delete"></li>'


async def announce(room_id: int, messages: list[Message]) -> None:
    """Tell the room's members' sidebars (any room, any process) of new messages. Never
    raises: the messages are stored, and every sidebar is exact again at its next read or snapshot."""
    if not messages:
        return
    try:
        await broadcast.to_room_activity(activity(room_id, messages))
    except Exception:
        log.warning("room %s: unread activity not sent", room_id, exc_info=True)


def room_ids(user_id: int) -> list[int]:
    """The rooms whose activity a socket of this user follows (its sidebar's): the
    summary's rooms (as SQL for the same reason: `_summary_sql`)."""
    with connection.cursor() as cursor:
        cursor.execute(_summary_sql(connection.vendor)[2], [user_id, Room.Status.ARCHIVED])
        return [row[0] for row in cursor.fetchall()]


class Sidebar:
    """One socket's sidebar: the activity groups it follows and what it shows (Tracker)."""

    __slots__ = ("channel", "followed", "tracker")  # one per socket, for its life

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.tracker: Tracker | None = None
        self.followed: set[int] = set()

    async def follow(self, user_id: int, username: str, room_id: int) -> str:
        """Join the activity groups of the user's rooms other than `room_id` (its frames
        reach the page already, which counts them: notify.js), then read their counts
        (joined first: a post counted by both is told apart by its seq); the list, whole."""
        ids = [i for i in await database_sync_to_async(room_ids)(user_id) if i != room_id]
        # Joined at once, not one round trip after another (a connect waits on them). A resync
        # joins them all again: a Redis that came back has lost its groups.
        await asyncio.gather(*(broadcast.join(activity_group(other), self.channel) for other in ids))
        self.followed.update(ids)
        self.tracker = await database_sync_to_async(Tracker.load)(user_id, username, room_id)
        return self.tracker.html()

    def event(self, event: Activity | Read) -> str | None:
        """A room had new messages, or the user read one: its entry, if it changed."""
        if self.tracker is None:
            return None
        if event["type"] == "unread.activity":
            return self.tracker.on_activity(event)
        return self.tracker.on_read(event)

    def forget(self, room_id: int) -> str | None:
        return self.tracker.forget(room_id) if self.tracker is not None else None

    async def unfollow(self) -> None:
        followed, self.followed = self.followed, set()
        await asyncio.gather(*(broadcast.leave(activity_group(room_id), self.channel) for room_id in followed))
