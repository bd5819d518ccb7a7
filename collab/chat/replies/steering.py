"""Steering a reply while it streams (docs/wire.md, "steer a reply"): a member's note made
into what the reply's text and its model get (`note`), and taken to the process that runs
the reply, wherever it is (the engine's part, the boundary and the next request, is
chat/steer.py).

    deliver      the reply runs here: the registry takes the note at once (or says it
                 is ending); it runs elsewhere (some process holds its lease): a
                 `reply.steer` control event to every process, whose owner takes it
                 (`on_control`) and tells the member's socket when it could not
    take_turn    at most MAX_STEERS notes per reply, across the deployment (a bucket in
                 the shared state)

Nothing here is on the per-piece path: a note costs one control event, and its reply
one more model request.
"""

from __future__ import annotations

import logging

from collab.chat import broadcast, frames, rendering, shared
from collab.chat.errors import ClientError
from collab.chat.events import ReplySteer
from collab.chat.generation import registry
from collab.chat.steer import MARK, Note

log = logging.getLogger(__name__)

MAX_NOTE_CHARS = 300
MAX_STEERS = 5  # notes per reply
_STEERS_REFILL_S = 86_400.0  # a reply's bucket gives one more a day: none within a reply's life

# The model's last turn after a note (its answer so far is its own turn before it).
PROMPT = (
    "{by}, a member of this room, steers your answer while you write it: {note}\n"
    "Continue your answer from exactly where it stopped, following this note. "
    "Do not repeat what you already wrote and do not start over."
)
NOT_STREAMING = "This reply is no longer being written: there is nothing to steer."


def note(by: str, text: str) -> Note:
    """`by`'s note `text` (one line, checked: commands/steer.py) as the engine takes it."""
    return Note(marker=f"{MARK}{by}: {text}", prompt=PROMPT.format(by=by, note=text))


async def take_turn(reply_id: int) -> None:
    """One of the reply's MAX_STEERS notes, or `steer.too_many`."""
    try:
        taken = await shared.backend().take(f"steer:{reply_id}", float(MAX_STEERS), _STEERS_REFILL_S)
    except shared.UNAVAILABLE:
        raise ClientError(
            "server.unavailable", "The server cannot reach its shared state just now; nothing was sent. Try again."
        ) from None
    if not taken:
        raise ClientError("steer.too_many", f"A reply can be steered at most {MAX_STEERS} times.")


async def deliver(reply_id: int, by: str, text: str, channel: str) -> bool:
    """Hand the note to the reply, on whichever process runs it; False when no process
    runs it (or this one, which does, says it is ending). `channel`: the member's socket."""
    taken = registry.steer(reply_id, note(by, text))
    if taken is not None:
        return taken
    try:
        leased = await shared.backend().leased([reply_id])
    except shared.UNAVAILABLE:
        raise ClientError(
            "server.unavailable", "The server cannot reach its shared state just now; nothing was sent. Try again."
        ) from None
    if not leased:
        return False
    event: ReplySteer = {"type": "reply.steer", "message_id": reply_id, "by": by, "text": text, "channel": channel}
    await broadcast.to_processes(event)
    return True


async def on_control(event: ReplySteer) -> None:
    """A note for a reply that may run here (every process gets it; its owner acts)."""
    taken = registry.steer(int(event["message_id"]), note(str(event["by"]), str(event["text"])))
    if taken is False and event.get("channel"):  # it was ending here: the member is told
        error = frames.other(rendering.frame_error("steer.not_streaming", NOT_STREAMING))
        try:
            await broadcast.to_channel(event["channel"], dict(error))
        except Exception:
            log.warning("could not tell a socket its steer came too late", exc_info=True)
