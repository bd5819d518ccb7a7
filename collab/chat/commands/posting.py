"""`post` (docs/wire.md, "post"): a member's message, its files, and the replies it asks
for. A post carries text, files (upload ids: services/attachments.py), or both."""

from __future__ import annotations

import uuid

from collab.chat import rendering
from collab.chat.commands.registry import Ctx, command
from collab.chat.errors import ClientError
from collab.chat.replies import posting
from collab.chat.services import attachments, availability, threads
from collab.chat.services.rooms import take_post_token

PARAMS = {
    "text": posting.check_post_text,
    "client_id": posting.check_client_id,
    "thread": threads.check_thread,
    "files": attachments.check_files,
}


@command("post", params=PARAMS, rate=take_post_token)
async def post(ctx: Ctx, text: str, client_id: uuid.UUID | None, thread: int | None, files: list[int]) -> None:
    # The member is checked on the database thread as the post is stored (ctx.check): its
    # model requests may go out before that (replies/early.py), never a wrong one. `thread`:
    # a reply in the thread of that message (services/threads.py), checked as it is stored.
    if not text and not files:
        raise ClientError("message.empty", "An empty message was not sent.")
    result = await posting.post_message(
        ctx.user_id,
        ctx.room_id,
        text,
        client_id,
        ctx.socket.username,
        member=lambda: ctx.check().membership,
        thread=thread,
        files=files,
    )
    if result.unsent_frame is not None:  # stored, not broadcast: the poster sees it now
        await ctx.tell(result.unsent_frame)
    for name in result.unknown_mentions:
        await ctx.tell(
            rendering.frame_error(
                "mention.unknown", f"No assistant called @{name} is in this room; your message was posted as written."
            )
        )
    for name in result.unavailable:  # attached, but staff have not granted it to this room
        error = availability.unavailable_error(name)
        await ctx.tell(rendering.frame_error(error.code, error.message))
    if result.refused is not None:  # stored, and no reply started (room.budget)
        await ctx.tell(rendering.frame_error(result.refused.code, result.refused.message))
