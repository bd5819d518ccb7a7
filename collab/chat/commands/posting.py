"""`post` (docs/wire.md, "post"): a member's message, and the replies it asks for."""

from __future__ import annotations

import uuid

from collab.chat import rendering
from collab.chat.commands.registry import Ctx, command
from collab.chat.replies import posting
from collab.chat.services.rooms import take_post_token


@command("post", params={"text": posting.check_text, "client_id": posting.check_client_id}, rate=take_post_token)
async def post(ctx: Ctx, text: str, client_id: uuid.UUID | None) -> None:
    # The member is checked on the database thread as the post is stored (ctx.check): its
    # model requests may go out before that (replies/early.py), never a wrong one.
    result = await posting.post_message(
        ctx.user_id, ctx.room_id, text, client_id, ctx.socket.username, member=lambda: ctx.check().membership
    )
    if result.unsent_frame is not None:  # stored, not broadcast: the poster sees it now
        await ctx.tell(result.unsent_frame)
    for name in result.unknown_mentions:
        await ctx.tell(
            rendering.frame_error(
                "mention.unknown", f"No assistant called @{name} is in this room; your message was posted as written."
            )
        )
    if result.refused is not None:  # stored, and no reply started (room.budget)
        await ctx.tell(rendering.frame_error(result.refused.code, result.refused.message))
