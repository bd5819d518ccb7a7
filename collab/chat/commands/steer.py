"""`steer` (docs/wire.md, "steer a reply"): any member who sees a streaming reply (a
personal reply: its recipient alone, through `visible_to`) adds a note to it; the reply
stops at a clean boundary and goes on, in the same article, following the note, with a
marker where it was steered and by whom (collab/chat/steer.py, replies/steering.py).

Refused, changing nothing: a note that is empty, too long or not text; a reply that is
no longer streaming (`steer.not_streaming`), an agent's run (`steer.agent`); more than
MAX_STEERS notes on one reply (`steer.too_many`); and as a regeneration is: the posting
rate (a note costs a model request), a locked or archived room, a spent budget.
"""

from __future__ import annotations

import re

from collab.chat.commands.registry import REPLY, Access, Ctx, command
from collab.chat.errors import ClientError
from collab.chat.models import Message
from collab.chat.replies import steering
from collab.chat.services import budgets
from collab.chat.services.rooms import take_post_token

# NUL and lone surrogates cannot be stored or sent (one in a reply's text would break its
# pieces and its final write); other control characters and bidirectional overrides would
# make the marker, shown under the member's name, say something else than it does.
_REFUSED = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\u202a-\u202e\u2066-\u2069]")


def note_text(value: object) -> str:
    """The note as one line: its runs of whitespace made one space."""
    if value is not None and (not isinstance(value, str) or _REFUSED.search(value)):
        raise ClientError("steer.invalid", "A steering note is text, without control characters.")
    text = " ".join((value or "").split())
    if not text:
        raise ClientError("steer.empty", "Write what the reply should do differently.")
    if len(text) > steering.MAX_NOTE_CHARS:
        raise ClientError("steer.too_long", f"A steering note is at most {steering.MAX_NOTE_CHARS} characters.")
    return text


def _check(access: Access) -> tuple[Message, str]:
    reply = access.message
    assert reply is not None
    if reply.status != Message.Status.STREAMING or reply.deleted_at is not None:
        raise ClientError("steer.not_streaming", steering.NOT_STREAMING)
    if reply.agent_steps is not None:
        raise ClientError("steer.agent", "An agent's run cannot be steered: stop it and ask again.")
    budgets.check(access.room)  # a spent monthly budget: no further model request (room.budget)
    return reply, access.membership.user.get_username()


@command("steer", params={"text": note_text}, message=REPLY, open_room=True, rate=take_post_token)
async def steer(ctx: Ctx, text: str) -> None:
    reply, by = await ctx.store(_check)
    await steering.take_turn(reply.id)
    if not await steering.deliver(reply.id, by, text, ctx.socket.channel_name):
        raise ClientError("steer.not_streaming", steering.NOT_STREAMING)
