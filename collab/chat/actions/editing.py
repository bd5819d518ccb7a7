"""Editing and deleting one's own message, broadcast to the room (docs/wire.md, "edit"
and "delete").

Only the author's own person-written messages, in an open room, in the socket's own
room. An edit replaces the text and its HTML and sets `edited_at`; a delete empties both
and sets `deleted_at` (a tombstone: the article stays, in its place, saying so). Replies
already made stay; they are marked as answering an edited message (rendering.py). The
next replies' context reads the stored text, so it holds the edit and skips the
tombstone (context.py skips empty texts).
"""

from __future__ import annotations

import re

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone

from collab.chat import broadcast, rendering
from collab.chat.actions import rooms
from collab.chat.actions.posting import check_post
from collab.chat.errors import ClientError
from collab.chat.events import RoomFrame
from collab.chat.markup import render_user_markdown
from collab.chat.models import Membership, Message, Room

MAX_REPLIES_SENT = 50  # an edit frame re-sends at most this many replies (the rest: marked in later snapshots)
_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII digits only, as replies._reply_in_room


def _own_message(user_id: int, room_id: int, message_id: object) -> Message:
    """The member's own message in this room, locked for the change; else a ClientError.
    Called inside a transaction."""
    if isinstance(message_id, bool) or not isinstance(message_id, int | str) or not _DIGITS.fullmatch(str(message_id)):
        raise ClientError("message.invalid_id", "message_id must be a message number.")
    if not Membership.objects.filter(room_id=room_id, user_id=user_id).exists():
        raise ClientError("room.forbidden", "You are not a member of this room.")
    message = (
        Message.objects.select_for_update().filter(pk=int(message_id), room_id=room_id).visible_to(user_id).first()
    )
    if message is None:
        raise ClientError("message.not_found", "There is no such message in this room.")
    if message.role != Message.Role.USER or message.author_id != user_id:
        raise ClientError("message.not_yours", "You can edit or delete only your own messages.")
    if message.deleted_at is not None:
        raise ClientError("message.deleted", "This message was deleted.")
    rooms.check_open(Room.objects.get(pk=room_id))
    return message


def _store_edit(user_id: int, room_id: int, message_id: object, text: str, html: str) -> Message | None:
    """The edited message; None when the text is unchanged (nothing stored, nothing sent)."""
    with transaction.atomic():
        message = _own_message(user_id, room_id, message_id)
        if message.text == text:
            return None
        message.text, message.html, message.edited_at = text, html, timezone.now()
        message.save(update_fields=["text", "html", "edited_at"])
        return message


def _store_delete(user_id: int, room_id: int, message_id: object) -> Message:
    with transaction.atomic():
        message = _own_message(user_id, room_id, message_id)
        message.text, message.html, message.deleted_at = "", "", timezone.now()
        message.save(update_fields=["text", "html", "deleted_at"])
        return message


def _frame(message: Message) -> RoomFrame:
    """The message's article whole, replacing the one each member shows; and its finished
    replies', now marked as answering an edited message (a streaming one gets the mark
    with its final article or the next snapshot)."""
    parts = [rendering.frame_final(message)]
    used = rendering.size(parts[0])
    if message.edited_at is not None:
        replies = message.replies.exclude(status=Message.Status.STREAMING).shared().order_by("seq")
        for reply in replies.select_related("reply_to")[:MAX_REPLIES_SENT]:
            html = rendering.frame_final(reply)
            if used + rendering.size(html) > rendering.budget("SNAPSHOT_BYTES"):  # far below the 1 MiB a frame may be
                html = rendering.article(reply, oob=True, compact=True).strip()  # its "show all" button alone
            parts.append(html)
            used += rendering.size(html)
    return {"type": "room.frame", "kind": "final", "msg": message.id, "html": "\n".join(parts)}


async def edit_message(user_id: int, room_id: int, message_id: object, text: object) -> None:
    clean, _ = check_post(text, None)  # the same rules as a post
    await rooms.take_post_token(user_id, room_id)  # and the same rate
    html = await sync_to_async(render_user_markdown, thread_sensitive=False)(clean)
    message = await database_sync_to_async(_store_edit)(user_id, room_id, message_id, clean, html)
    if message is not None:
        await broadcast.to_room(room_id, await database_sync_to_async(_frame)(message))


async def delete_message(user_id: int, room_id: int, message_id: object) -> None:
    await rooms.take_post_token(user_id, room_id)
    message = await database_sync_to_async(_store_delete)(user_id, room_id, message_id)
    await broadcast.to_room(room_id, await database_sync_to_async(_frame)(message))
