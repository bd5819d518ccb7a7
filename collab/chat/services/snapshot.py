"""What a (re)connecting member is shown: the recent messages, replies streaming on any
process with their text so far, and the member list; and older pages of history."""

from __future__ import annotations

import math

from channels.db import database_sync_to_async
from django.conf import settings
from django.db.models import Q

from collab.chat import attached, rendering, room_frames, shared
from collab.chat.models import Message, Room
from collab.chat.services import snapshot_cache, threads
from collab.chat.services.rooms import members_with

NO_FLOOR = math.inf  # a snapshot message that takes no more pieces, only its final article


def _recent(room_id: int, before_seq: int | None = None, user_id: int | None = None) -> tuple[list[Message], bool]:
    limit = settings.COLLAB["HISTORY_MESSAGES"]
    # Shared messages and this member's own personal replies (docs/architecture.md#a-personal-replies);
    # of a reply's versions, the one shown (docs/architecture.md#a-versions).
    # Not the messages of threads (services/threads.py): they show in their thread's panel.
    qs = Message.objects.filter(room_id=room_id, version_hidden=False, thread__isnull=True)
    qs = attached.with_files(qs.visible_to(user_id).select_related("recipient"))  # their files: one query
    if before_seq is not None:
        qs = qs.filter(seq__lt=before_seq)
    page = list(qs.order_by("-seq")[: limit + 1])
    return page[:limit][::-1], len(page) > limit


def personal(room_id: int, user_id: int) -> tuple[list[Message], list[Message]]:
    """The member's own personal replies a snapshot shows (docs/architecture.md#a-personal-replies):
    the newest top-level ones, and those streaming in threads; one query (database thread).
    Most members have none."""
    limit = settings.COLLAB["HISTORY_MESSAGES"]
    rows = (
        Message.objects.filter(room_id=room_id, recipient_id=user_id, version_hidden=False)
        .filter(Q(thread__isnull=True) | Q(status=Message.Status.STREAMING))
        .select_related("recipient", "reply_to")
        .order_by("-seq")[: limit + 1 + threads.LIVE_REPLIES]
    )
    found = list(attached.with_files(rows))[::-1]
    top = [m for m in found if m.thread_id is None][-(limit + 1) :]
    live = [m for m in found if m.thread_id is not None][-threads.LIVE_REPLIES :]
    return top, live


def history(room: Room, before_seq: int | None = None, user_id: int | None = None) -> rendering.Page:
    """A page of history before `before_seq` (None: the newest), within its byte budget,
    as member `user_id` sees it: its oldest messages may be left for the next page."""
    messages, has_older = _recent(room.id, before_seq, user_id)
    return rendering.history_page(messages, has_older=has_older)


async def snapshot(room_id: int, room_slug: str, user_id: int | None = None) -> tuple[str, str, dict[int, float]]:
    """The frames a member gets on (re)connect, and the `floors` that keep what follows
    gap-free and duplicate-free for that member.

    The caller has already joined the room's group, so every frame sent after that is
    queued for it. A streaming reply's text is read from the shared state *after* that
    join, and its owner appends each piece there *before* broadcasting it: so a piece is
    either in the text read (length L) or in a frame that reaches this socket, and
    queued pieces below L are dropped (floor L). A reply not begun yet has floor 0 (all
    its pieces follow); every other message takes no piece at all (floor = inf) and only
    a whole `final` article replaces it.

    Both frames together fit the snapshot's byte budget (rendering.py): the newest
    messages that fit, long ones cut, the rest reachable as older pages. A streaming
    reply is always shown with `data-length` = L; a very long one only from character
    `data-from` on, which keeps L and the offsets that follow exact. Messages left out
    keep their floor (infinity): a `final` for them finds no article and changes nothing.
    """
    room = await snapshot_cache.room_view(room_id)  # what everyone's snapshot shares, read once
    mine: list[Message] = []
    mine_live: list[Message] = []
    if user_id in room.recipients:  # most members have no personal reply: nothing to read
        mine, mine_live = await database_sync_to_async(personal)(room_id, user_id)
    limit = settings.COLLAB["HISTORY_MESSAGES"]
    recent = sorted([*room.recent, *mine], key=lambda m: m.seq)[-(limit + 1) :] if mine else room.recent
    messages, has_older = recent[-limit:], len(recent) > limit
    thread_messages = room.thread_live
    if mine_live:
        thread_messages = sorted([*thread_messages, *mine_live], key=lambda m: m.seq)[-threads.LIVE_REPLIES :]
    state = shared.backend()
    views = await state.read([m.id for m in messages if m.status == Message.Status.STREAMING])
    online = await state.online(room_id)
    members = members_with(room.members, online)
    # The replies streaming in threads, for a page with their thread open (and their floors:
    # a reconnect resumes them too), outside the room's list.
    thread_live, thread_floors = await threads.live_html(thread_messages)
    live_texts: dict[int, str] = {}
    thinking: dict[int, str] = {}  # a reasoning model's thinking so far, floor -id (consumers.take_frame)
    states: dict[int, str] = {}
    floors: dict[int, float] = {}
    for m in messages:
        view = views.get(m.id)
        if m.status != Message.Status.STREAMING or (view is not None and view.ended):
            floors[m.id] = floors[-m.id] = NO_FLOOR
        elif view is None and (m.text or m.reasoning):
            # Checkpointed, but no live record (its process died, or Redis lost it): the
            # stored text so far, and no pieces; its final article (the sweep's, or the
            # owner's once it restores the record and resyncs the sockets) replaces it.
            live_texts[m.id], thinking[m.id] = m.text, m.reasoning
            floors[m.id] = floors[-m.id] = NO_FLOOR
        elif view is None:  # announced, not begun: every piece is still to come
            live_texts[m.id] = ""
            floors[m.id] = floors[-m.id] = 0
        else:
            live_texts[m.id], thinking[m.id] = view.text, view.thinking
            states[m.id] = view.state
            floors[m.id], floors[-m.id] = len(view.text), len(view.thinking)
    members_html = room_frames.frame_members(members) + room.header_html + room.panels_html + thread_live
    html, _page = rendering.frame_snapshot(
        messages,
        live_texts,
        has_older=has_older,
        room_slug=room_slug,
        states=states,
        members_html=members_html,
        live_thinking=thinking,
        memo=room.articles,
    )
    floors.update(thread_floors)
    return html, members_html, floors
