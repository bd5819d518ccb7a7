"""Threads (docs/wire.md, "threads"; docs/architecture/threads.md): a reply in a thread hangs
on a top-level message of the room (its `thread`), and stays out of the room's timeline,
its snapshots and the history the room's assistants are sent. An assistant mentioned in a
thread is sent the thread instead: the message it hangs on, then the thread's messages.

A thread reply to a message that is itself in a thread goes to that same thread (threads
are one level deep). The parent keeps its thread's count and last time (`thread_replies`,
`thread_last_at`), recounted in the transaction that adds to the thread, and its line
("3 replies · last 14:02") goes to the whole room with the thread's new articles. Nothing
here runs per streamed piece: a thread reply's pieces are the same frames as any reply's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from django.db.models import Count, Max, Q
from django.template.loader import get_template

from collab.chat import attached, rendering, shared
from collab.chat.context import HISTORY_COLUMNS, HISTORY_MESSAGES, HistoryRow
from collab.chat.errors import ClientError
from collab.chat.models import Membership, Message, Room, room_order

_line = get_template("chat/_thread_line.html")
_frame = get_template("chat/_thread_frame.html")
_live = get_template("chat/_thread_live.html")

LIVE_REPLIES = 8  # streaming thread replies a snapshot holds (for their resume), newest first
LIVE_CHARS = 4096  # ... each with at most this tail of its text so far (data-from, as a long live reply)
_DIGITS = re.compile(r"[0-9]{1,18}")


def check_thread(value: object) -> int | None:
    """The post's `thread` (the message it replies to in a thread), or None: the room."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int | str) or not _DIGITS.fullmatch(str(value)):
        raise ClientError("thread.invalid_id", "thread must be a message number.")
    return int(str(value))


def parent_for_post(membership: Membership, thread: int) -> Message:
    """The top-level message a post in thread `thread` hangs on, checked (in the post's
    transaction): a message of this room the member sees, not deleted, not a personal
    reply; a message in a thread stands for its thread."""
    # A hidden version keeps its thread: a reply asked again (its slot shows another version)
    # took none of its thread's messages with it (docs/wire.md, "Threads").
    seen = Message.objects.filter(room_id=membership.room_id).visible_to(membership.user_id)
    found = seen.filter(pk=thread).only("id", "thread_id", "deleted_at", "recipient_id").first()
    if found is not None and found.thread_id is not None:  # a reply in a thread: that same thread
        found = seen.filter(pk=found.thread_id).only("id", "thread_id", "deleted_at", "recipient_id").first()
    if found is None:
        raise ClientError("thread.not_found", "There is no such message in this room to reply to in a thread.")
    if found.deleted_at is not None:
        raise ClientError("thread.deleted", "That message was deleted: its thread takes no more replies.")
    if found.recipient_id is not None:
        raise ClientError("thread.personal", "A personal reply has no thread: share it with the room first.")
    return found


def recount(parent_id: int) -> Message:
    """The parent's count and last time, recounted from its thread's shared, shown
    messages (in the transaction that changed them), and the parent as it now is."""
    counts = (
        Message.objects.filter(thread_id=parent_id, version_hidden=False)
        .shared()
        .aggregate(n=Count("id"), last=Max("created_at"))
    )
    Message.objects.filter(pk=parent_id).update(thread_replies=counts["n"], thread_last_at=counts["last"])
    return Message.objects.only("id", "room_id", "thread_replies", "thread_last_at").get(pk=parent_id)


def history_rows(room: Room, answered: Message) -> list[HistoryRow]:
    """A reply's history in a thread: the message the thread hangs on, then the thread's
    shared messages up to `answered` (of a reply's versions, the one shown), in the room's
    order; never the room's other messages."""
    root = answered.thread_id
    rows = (
        Message.objects.filter(
            Q(pk=root) | Q(thread_id=root, seq__lte=answered.seq) | Q(thread_id=root, slot_seq__lte=answered.seq),
            room_id=room.id,
            version_hidden=False,
        )
        .shared()
        .order_by("-seq")
        .values_list(*HISTORY_COLUMNS)[:HISTORY_MESSAGES]
    )
    return sorted((HistoryRow._make(r) for r in rows), key=room_order)


def line(parent: Message, oob: bool = True) -> str:
    """The parent's "N replies · last HH:MM" line (`#msg-P-thread`)."""
    return _line.render({"m": parent, "oob": oob}).strip()


def frame_new(messages: Sequence[Message], parent: Message | None = None) -> str:
    """New messages: appended to the room's list, or, in a thread, to the page's hidden
    `#thread-live` (static/collab/threads.js moves them into the thread's panel when it
    is open, keeps a streaming reply there until it ends, so that its pieces always find
    it, and drops the rest), with the parent's line when it is given."""
    thread = messages[0].thread_id if messages else None
    if thread is None:
        return rendering.frame_new(messages)
    limit = rendering.budget("FRAME_ARTICLE_BYTES")
    articles = [rendering.article(m, limit=limit) for m in messages]
    html = _frame.render({"articles": articles}).strip()
    return html + (line(parent) if parent is not None else "")


# The thread's panel shows its newest messages, at most this many: a thread of thousands is
# read whole in search and the exports, never rendered whole on every open or reconnect.
THREAD_PAGE = 200


def thread_messages(parent: Message, user_id: int) -> tuple[list[Message], int]:
    """The thread's newest messages a member sees (their own personal replies included), in
    order, and how many earlier ones are left out."""
    seen = Message.objects.filter(thread_id=parent.pk, room_id=parent.room_id, version_hidden=False).visible_to(user_id)
    rows = list(attached.with_files(seen.select_related("recipient", "reply_to")).order_by("-seq")[:THREAD_PAGE])
    earlier = seen.count() - len(rows) if len(rows) == THREAD_PAGE else 0
    return sorted(rows, key=room_order), earlier


def parent_for_view(room: Room, user_id: int, thread: int) -> Message | None:
    """The top-level message a thread hangs on, for the thread's panel (None: no such)."""
    seen = Message.objects.filter(room_id=room.pk, thread__isnull=True).visible_to(user_id)  # hidden versions too
    return seen.filter(pk=thread).first()


def live_replies(room_id: int) -> list[Message]:
    """The shared replies streaming in the room's threads, the newest LIVE_REPLIES, in seq
    order (database thread); a member's own personal ones: services/snapshot.py's `personal`."""
    rows = Message.objects.filter(room_id=room_id, thread__isnull=False, status=Message.Status.STREAMING).shared()
    return list(rows.select_related("recipient", "reply_to").order_by("-seq")[:LIVE_REPLIES])[::-1]


async def live_html(messages: Sequence[Message]) -> tuple[str, dict[int, float]]:
    """The replies streaming in the room's threads that a member sees (`live_replies`),
    with their text so far (`<div id="thread-live">`: a page with their thread open
    moves them there), and their floors: a reconnecting socket resumes them as it does
    the room's own (services/snapshot.py)."""
    if not messages:
        return _live.render({"articles": []}).strip(), {}
    views = await shared.backend().read([m.id for m in messages])
    floors: dict[int, float] = {}
    articles = []
    for m in messages:
        view = views.get(m.id)
        if (view is not None and view.ended) or (view is None and (m.text or m.reasoning)):
            # Ended, or checkpointed with no live record: its final article follows, no piece.
            text, thinking, state = m.text, m.reasoning, ""
            floors[m.id] = floors[-m.id] = float("inf")
        elif view is None:  # announced, not begun: every piece is still to come
            text, thinking, state = "", "", ""
            floors[m.id] = floors[-m.id] = 0
        else:
            text, thinking, state = view.text, view.thinking, view.state
            floors[m.id], floors[-m.id] = len(text), len(thinking)
        start = max(0, len(text) - LIVE_CHARS)
        t_start = max(0, len(thinking) - LIVE_CHARS)
        articles.append(
            rendering.article(
                m,
                live_text=text[start:],
                live_from=start,
                state=state,
                live_thinking=thinking[t_start:],
                thinking_from=t_start,
            )
        )
    return _live.render({"articles": articles}).strip(), floors
