"""The actions on a reply (docs/wire.md): `stop`, `regenerate`, `continue`, and `merge`
(on a question: its approved answers merged into one reply). Each starts or ends a reply
through the reply pipeline (collab/chat/replies/)."""

from __future__ import annotations

from collab.chat.commands.registry import MESSAGE, REPLY, Access, Ctx, command, raw
from collab.chat.errors import ClientError
from collab.chat.models import Message
from collab.chat.replies import again, continuation, interrupt, merging
from collab.chat.services import moderation, streams
from collab.chat.services.rooms import take_post_token


def _check_stop(access: Access) -> Message:
    reply = access.message
    assert reply is not None
    user_id = access.membership.user_id
    asker = reply.reply_to.author_id if reply.reply_to else None
    if user_id != asker and user_id != reply.recipient_id and not access.membership.moderates:
        raise ClientError(
            "reply.forbidden", "Only the person who asked, a moderator or the room's owner can stop a reply."
        )
    if reply.status != Message.Status.STREAMING:
        raise ClientError("reply.not_streaming", "This reply has already ended.")
    if user_id != asker:  # a moderator's (or the owner's) act on someone else's reply: audited
        moderation.record(access.actor, "stop_reply", reply.room, detail=f"reply {reply.pk} ({reply.author_name})")
    return reply


@command("stop", message=REPLY)
async def stop(ctx: Ctx) -> None:
    """Stop a reply on whichever process runs it; one that no process runs any more (its
    process died) ends now, with the text it had."""
    reply = await ctx.store(_check_stop)
    if not await streams.stop_running(reply.id):
        await interrupt.interrupt(reply.id, status=Message.Status.STOPPED, error="")


@command("regenerate", message=REPLY, rate=take_post_token)
async def regenerate(ctx: Ctx) -> None:
    reply, jobs = await ctx.store(lambda access: again.store_regenerate(access.message))
    await again.start(reply, jobs)


@command("continue", message=REPLY, rate=take_post_token)
async def continue_(ctx: Ctx) -> None:
    """A reply cut off at the token limit streams on from where it stopped."""
    reply, job, tokens, prompt_tokens = await ctx.store(lambda access: continuation.store_continue(access.message))
    await continuation.start(reply, job, tokens, prompt_tokens)


@command("merge", params={"assistant": raw}, message=MESSAGE, open_room=True, rate=take_post_token)
async def merge(ctx: Ctx, assistant: object) -> None:
    """Merge the approved answers to a question; `assistant`: the @handle that merges (the
    room's default when absent)."""
    reply, job = await ctx.store(lambda access: merging.store_merge(access.room, access.message, assistant))
    await merging.start(reply, job)
