"""Ending a reply that no process runs any more (its owner died, its lease expired, or
it was stopped with nobody running it) with the text it had streamed."""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.utils import timezone

from collab.chat import broadcast, shared
from collab.chat.markup import arender_markdown, render_markdown
from collab.chat.models import Message
from collab.chat.replies.sink import send_final


def _store_interrupted(
    reply_id: int, text: str | None, status: str, error: str, html: str | None, reasoning: str | None = None
) -> Message | None:
    message = Message.objects.select_related("recipient").filter(pk=reply_id).first()
    if message is None:
        return None
    fields = {"status": status, "error": error, "finished_at": timezone.now()}
    if text is not None:
        fields.update(text=text, html=html or "")
        if reasoning:  # the thinking streamed so far (its checkpoint is kept otherwise)
            fields.update(reasoning=reasoning)
    elif message.text:  # no live text (its process and the shared state lost it): what is stored
        fields.update(html=render_markdown(message.text))
    if not Message.objects.filter(pk=reply_id, status=Message.Status.STREAMING).update(**fields):
        message.refresh_from_db()  # ended meanwhile: send what is stored
        return message
    for name, value in fields.items():
        setattr(message, name, value)
    return message


async def interrupt(reply_id: int, *, status: str = Message.Status.INTERRUPTED, error: str = "") -> None:
    """End a reply that no process runs any more (a dead owner, an expired lease) with
    the text it had streamed, and send its article whole; idempotent across processes
    (only a reply still `streaming` changes; any other is re-sent as stored).

    Ended in the shared state first: an owner that was only stalled can add no piece
    after the text read here (shared.ReplyEnded), and is told to stop."""
    state = shared.backend()
    await state.end(reply_id)
    await broadcast.to_processes({"type": "reply.stop", "message_id": reply_id, "reason": "interrupted"})
    view = (await state.read([reply_id])).get(reply_id)
    text = view.text if view is not None else None
    html = await arender_markdown(text) if text else ""
    if status == Message.Status.INTERRUPTED and not error:
        error = "interrupted: the server running this reply stopped"
    reasoning = view.thinking if view is not None else None
    message = await database_sync_to_async(_store_interrupted)(reply_id, text, status, error, html, reasoning)
    if message is not None:
        await send_final(message)
