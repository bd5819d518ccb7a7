"""`typing` (docs/wire.md, "typing"): "NAME is typing…" to the room, but NAME's own
sockets. Who is online is services/presence.py.

The page sends it at most once every 2 s while its member types, and clears it by itself
(4 s, or NAME's message arriving: static/collab/collab.js). The server caps it too, per
member and room across every process (a token bucket of one in the shared state,
refilled every `TYPING_EVERY_S`): a notice over the cap is dropped without a word, and
counted (metrics.TYPING, outcome "dropped"); not a `rate` of the registry, which refuses.
"""

from __future__ import annotations

from django.conf import settings
from django.template.loader import render_to_string

from collab.chat import broadcast, frames, metrics, shared
from collab.chat.commands.registry import Ctx, command
from collab.chat.models import Room


@command("typing")
async def typing(ctx: Ctx) -> None:
    # The cap first: a flood costs a shared-state call per frame, never a database query.
    try:
        taken = await shared.backend().take(
            f"typing:{ctx.user_id}:{ctx.room_id}", 1.0, settings.COLLAB["TYPING_EVERY_S"]
        )
    except shared.UNAVAILABLE:
        taken = False  # a typing notice is not worth an error
    if not taken:
        metrics.TYPING.labels("dropped").inc()
        return
    access = await ctx.resolve()
    if access.room.status != Room.Status.OPEN:  # nobody in a locked or archived room is about to post
        metrics.TYPING.labels("dropped").inc()
        return
    html = render_to_string("chat/_typing.html", {"username": access.membership.user.get_username()})
    await broadcast.to_room(ctx.room_id, frames.other(html, not_user=ctx.user_id, ephemeral=True))
    metrics.TYPING.labels("sent").inc()
