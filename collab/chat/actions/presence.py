"""Who is typing (docs/wire.md, "typing"); who is online is rooms.socket_opened/closed.

`{"action": "typing"}` from a member sends the room "NAME is typing…", to every socket
but NAME's own. The page sends it at most once every 2 s while its member types, and
clears it by itself (4 s, or NAME's message arriving: static/collab/collab.js). The
server caps it too, per member and room across every process (a token bucket of one in
the shared state, refilled every `TYPING_EVERY_S`): a notice over the cap is dropped
without a word, and counted (metrics.TYPING, outcome "dropped").
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.conf import settings
from django.template.loader import render_to_string

from collab.chat import broadcast, metrics, shared
from collab.chat.errors import ClientError
from collab.chat.models import Membership, Room


def _typist(user_id: int, room_id: int) -> str | None:
    """The member's name, or None when the room does not take posts (locked, archived):
    nobody there can be about to post. Not a member: refused."""
    row = Membership.objects.filter(room_id=room_id, user_id=user_id).values_list("user__username", "room__status")
    found = row.first()
    if found is None:
        raise ClientError("room.forbidden", "You are not a member of this room.")
    username, status = found
    return username if status == Room.Status.OPEN else None


async def typing(user_id: int, room_id: int, channel_name: str) -> None:
    # The cap first: a flood costs a shared-state call per frame, never a database query.
    try:
        taken = await shared.backend().take(f"typing:{user_id}:{room_id}", 1.0, settings.COLLAB["TYPING_EVERY_S"])
    except shared.UNAVAILABLE:
        taken = False  # a typing notice is not worth an error
    if not taken:
        metrics.TYPING.labels("dropped").inc()
        return
    username = await database_sync_to_async(_typist)(user_id, room_id)
    if username is None:
        metrics.TYPING.labels("dropped").inc()
        return
    html = render_to_string("chat/_typing.html", {"username": username})
    await broadcast.to_room(room_id, {"type": "room.frame", "kind": "other", "html": html, "not_user": user_id})
    metrics.TYPING.labels("sent").inc()
