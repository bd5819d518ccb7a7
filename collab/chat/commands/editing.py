"""Editing and deleting one's own message, broadcast to the room (docs/wire.md, "edit"
and "delete").

Only the author's own person-written messages, in an open room, in the socket's own
room. An edit replaces the text and its HTML and sets `edited_at`; a delete empties both
and sets `deleted_at` (a tombstone: the article stays, in its place, saying so). Replies
already made stay; they are marked as answering an edited message (rendering.py). The
next replies' context reads the stored text, so it holds the edit and skips the
tombstone (context.py skips empty texts). An edit keeps the message's files; a delete
deletes them with it, in its transaction (services/attachments.py: their bytes follow
once it commits).
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone

from collab.chat import broadcast, frames, rendering
from collab.chat.commands.registry import MESSAGE, Access, Ctx, command
from collab.chat.errors import ClientError
from collab.chat.events import RoomFrame
from collab.chat.markup import arender_user_markdown
from collab.chat.models import Message
from collab.chat.replies.posting import check_text
from collab.chat.services import attachments
from collab.chat.services.rooms import take_post_token

MAX_REPLIES_SENT = 50  # an edit frame re-sends at most this many replies (the rest: marked in later snapshots)


def _own_message(access: Access) -> Message:
    """The member's own message, locked for the change; else a ClientError. Called inside
    a transaction."""
    assert access.message is not None
    message = Message.objects.select_for_update().get(pk=access.message.pk)
    if message.role != Message.Role.USER or message.author_id != access.membership.user_id:
        raise ClientError("message.not_yours", "You can edit or delete only your own messages.")
    if message.deleted_at is not None:
        raise ClientError("message.deleted", "This message was deleted.")
    return message


def _store_edit(access: Access, text: str, html: str) -> Message | None:
    """The edited message; None when the text is unchanged (nothing stored, nothing sent)."""
    with transaction.atomic():
        message = _own_message(access)
        if message.text == text:
            return None
        message.text, message.html, message.edited_at = text, html, timezone.now()
        message.save(update_fields=["text", "html", "edited_at"])
        return message


def _store_delete(access: Access) -> Message:
    with transaction.atomic():
        message = _own_message(access)
        message.text, message.html, message.deleted_at = "", "", timezone.now()
        message.save(update_fields=["text", "html", "deleted_at"])
        attachments.drop(message)
        return message


def _frame(message: Message) -> RoomFrame:
    """The message's article whole, replacing the one each member shows; and its finished
    replies', now marked as answering an edited message (a streaming one gets the mark
    with its final article or the next snapshot)."""
    parts = [rendering.frame_final(message)]
    used = rendering.size(parts[0])
    if message.edited_at is not None:
        replies = message.replies.exclude(status=Message.Status.STREAMING).filter(version_hidden=False).shared()
        replies = replies.order_by("seq")  # of a reply's versions, the one the pages show
        # Each at least as its "show all" button, counted first; then whole, in order, while
        # the frame stays within SNAPSHOT_BYTES (far below the 1 MiB a frame may be).
        shown = list(replies.select_related("reply_to")[:MAX_REPLIES_SENT])
        sent = [rendering.article(reply, oob=True, compact=True).strip() for reply in shown]
        used += sum(rendering.size(html) for html in sent)
        for i, reply in enumerate(shown):
            html = rendering.frame_final(reply)
            grows = rendering.size(html) - rendering.size(sent[i])
            if used + grows <= rendering.budget("SNAPSHOT_BYTES"):
                sent[i], used = html, used + grows
        parts += sent
    return frames.final(message.id, "\n".join(parts))


@command("edit", params={"text": check_text}, message=MESSAGE, open_room=True, rate=take_post_token)
async def edit(ctx: Ctx, text: str) -> None:
    """The same rules and rate as a post."""
    html = await arender_user_markdown(text)
    message = await ctx.store(_store_edit, text, html)
    if message is not None:
        await broadcast.to_room(ctx.room_id, await database_sync_to_async(_frame)(message))


@command("delete", message=MESSAGE, open_room=True, rate=take_post_token)
async def delete(ctx: Ctx) -> None:
    message = await ctx.store(_store_delete)
    await broadcast.to_room(ctx.room_id, await database_sync_to_async(_frame)(message))
