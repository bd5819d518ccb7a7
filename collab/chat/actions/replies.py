"""Replies: start them, give each a sink that keeps its live text in the shared state
and sends its frames, store how each ended, and stop, regenerate or interrupt them
from any process.

    start_and_announce ─> generation.registry.start(job, RoomSink)   the model request starts
                       ─> shared.begin (text "", owner lease) ─> broadcast "new"   then pieces flow
    then each piece, thought and the outcome go to the reply's sink (actions/sink.py)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from collab.chat import broadcast, rendering, shared
from collab.chat.actions import agents, budgets, votes
from collab.chat.actions.lenses import personal_lenses
from collab.chat.actions.prepared import Prepared
from collab.chat.actions.providers import deployment_slots, prices, provider_config
from collab.chat.actions.rooms import allocate_seqs, check_open, take_post_token
from collab.chat.actions.sink import RoomSink, _send_final
from collab.chat.context import HISTORY_COLUMNS, HISTORY_MESSAGES, HistoryRow, build_context
from collab.chat.errors import ClientError
from collab.chat.events import RoomFrame
from collab.chat.generation import ReplyJob, registry
from collab.chat.markup import render_markdown
from collab.chat.models import Assistant, Membership, Message, Room

log = logging.getLogger(__name__)

_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII digits only: "²".isdigit() is True, and int("²") fails

__all__ = ["ReplyJob", "RoomSink", "interrupt", "regenerate_reply", "start_and_announce", "stop_reply"]


def read_history(room: Room, answered: Message) -> list[HistoryRow]:
    """The room's messages up to `answered`, oldest first: only what the context needs, and
    no more messages than a budget could hold. Shared messages only: nobody's personal
    replies (docs/architecture.md#a-personal-replies)."""
    return [HistoryRow._make(row) for row in _HISTORY.values(room.id, answered.seq)[::-1]]


# Its SQL compiled once (actions/prepared.py): it runs on every post that asks.
_HISTORY = Prepared(
    lambda room_id, seq: (
        Message.objects.filter(room_id=room_id, seq__lte=seq)
        .shared()
        .order_by("-seq")
        .values_list(*HISTORY_COLUMNS)[:HISTORY_MESSAGES]
    ),  # tuples, not model instances
    2,
)


def reply_jobs(
    room: Room, replies: list[Message], answered: Message, rows: list[HistoryRow] | None = None
) -> list[ReplyJob]:
    """A job per reply; `rows`: the room's history as `read_history` returned it, if read."""
    history = votes.steer(room, read_history(room, answered) if rows is None else rows)
    lenses = personal_lenses(room, replies)
    jobs = []
    for reply in replies:
        assistant = reply.assistant
        assert assistant is not None
        budget = assistant.provider.context_chars or settings.COLLAB["CONTEXT_CHARS"]
        lens = lenses.get(reply.recipient_id, "")  # "": a shared reply
        jobs.append(
            ReplyJob(
                message_id=reply.id,
                room_id=room.id,
                provider=provider_config(assistant.provider),
                model=assistant.model_name,
                messages=build_context(assistant, room, history, budget, lens),
                temperature=assistant.temperature,
                max_tokens=assistant.max_tokens,
                recipient_id=reply.recipient_id,
                agent=agents.plan_for(assistant, room, answered, reply),
                price_per_m=prices(assistant.provider),
            )
        )
    return jobs


def create_placeholders(
    room: Room, answered: Message, assistants: list[Assistant], first_seq: int, recipient: User | None = None
) -> list[Message]:
    """A streaming placeholder per assistant; with `recipient`, personal replies (`/each`)."""
    if assistants:  # every invocation passes here: none once the room's budget is spent (room.budget)
        budgets.check(room)
    return [
        Message.objects.create(
            room=room,
            seq=first_seq + i,
            role=Message.Role.ASSISTANT,
            assistant=a,
            author_name=a.display_name,
            reply_to=answered,
            status=Message.Status.STREAMING,
            model=a.model_name,
            recipient=recipient,
            agent_steps=0 if a.is_agent else None,  # an agent's run (chat/agent.py)
        )
        for i, a in enumerate(assistants)
    ]


async def start_and_announce(
    jobs: list[ReplyJob], room_id: int, frame: RoomFrame, *more: RoomFrame, placeholders: Sequence[Message] = ()
) -> None:
    """Start the replies' model requests, then announce their articles (`more`: the
    personal replies' own "new" frames, actions/each.py): the announcement overlaps the
    model's time to first token, and no piece is sent before it. `placeholders`: the
    replies as just created, kept by their sinks for their final articles."""
    created = {p.id: p for p in placeholders}
    sinks = [RoomSink(job, created.get(job.message_id)) for job in jobs]
    for job, sink in zip(jobs, sinks, strict=True):
        registry.start(job, sink, slots=deployment_slots)
    try:
        state = shared.backend()
        for job in jobs:
            await state.begin(job.message_id, room_id, shared.PROCESS_ID)
        for announcement in (frame, *more):
            await broadcast.to_room(room_id, announcement)
    finally:
        for sink in sinks:
            sink.announced.set()


# --- stop, regenerate, interrupt ------------------------------------------------------------------


def _reply_in_room(user_id: int, room_id: int, message_id: object) -> tuple[Message, Membership]:
    if isinstance(message_id, bool) or not isinstance(message_id, int | str) or not _DIGITS.fullmatch(str(message_id)):
        raise ClientError("message.invalid_id", "message_id must be a message number.")
    membership = Membership.objects.filter(room_id=room_id, user_id=user_id).first()
    if membership is None:
        raise ClientError("room.forbidden", "You are not a member of this room.")
    message = (
        Message.objects.select_related("reply_to", "assistant__provider", "room", "recipient")
        .filter(pk=int(message_id), room_id=room_id, role=Message.Role.ASSISTANT)
        .visible_to(user_id)  # another member's personal reply: as if it did not exist
        .first()
    )
    if message is None:
        raise ClientError("message.not_found", "There is no such reply in this room.")
    return message, membership


def _check_stop(user_id: int, room_id: int, message_id: object, address: str | None) -> Message:
    message, membership = _reply_in_room(user_id, room_id, message_id)
    asker = message.reply_to.author_id if message.reply_to else None
    if user_id != asker and user_id != message.recipient_id and not membership.moderates:
        raise ClientError(
            "reply.forbidden", "Only the person who asked, a moderator or the room's owner can stop a reply."
        )
    if message.status != Message.Status.STREAMING:
        raise ClientError("reply.not_streaming", "This reply has already ended.")
    if user_id != asker:  # a moderator's (or the owner's) act on someone else's reply: audited
        from collab.chat.actions import moderation  # it imports this module

        actor = moderation.Actor(membership.user, address)
        moderation.record(actor, "stop_reply", message.room, detail=f"reply {message.pk} ({message.author_name})")
    return message


async def stop_reply(user_id: int, room_id: int, message_id: object, address: str | None = None) -> None:
    """Stop a reply on whichever process runs it; one that no process runs any more
    (its process died) ends now, with the text it had."""
    message = await database_sync_to_async(_check_stop)(user_id, room_id, message_id, address)
    if not await stop_running(message.id):
        await interrupt(message.id, status=Message.Status.STOPPED, error="")


async def stop_running(message_id: int) -> bool:
    """Stop a reply on whichever process runs it, without asking who may (the caller has:
    `stop_reply`, or moderation.stop_reply for staff). False when no process runs it any
    more (its process died): the caller ends it (`interrupt`), or leaves it to the sweep."""
    if registry.stop(message_id):
        return True
    if await shared.backend().leased([message_id]):
        await broadcast.to_processes({"type": "reply.stop", "message_id": message_id, "reason": "stopped"})
        return True
    return False


async def stop_all(room_id: int) -> None:
    """Stop every reply of a room, on every process."""
    for reply_id in registry.in_room(room_id):
        registry.stop(reply_id)
    await broadcast.to_processes({"type": "room.stop_all", "room_id": room_id})


def answerable_again(reply: Message) -> tuple[Room, Assistant, Message]:
    """What asking a reply's assistant again needs (a regeneration, a continuation): an
    open room, the assistant still in it, the question still there. Its room, assistant
    and question."""
    room = reply.room
    check_open(room)
    assistant = reply.assistant
    if assistant is None or not room.assistants.filter(pk=assistant.pk).exists():
        raise ClientError("assistant.unavailable", "That assistant is no longer in this room.")
    if reply.reply_to is None:
        raise ClientError("message.not_found", "The question this reply answered is gone.")
    if reply.reply_to.deleted_at is not None:  # the model would answer the message before it
        raise ClientError("message.deleted", "The question this reply answered was deleted.")
    return room, assistant, reply.reply_to


def _store_regenerate(user_id: int, room_id: int, message_id: object) -> tuple[Message, list[ReplyJob]]:
    with transaction.atomic():
        old, _ = _reply_in_room(user_id, room_id, message_id)
        if old.status == Message.Status.STREAMING:
            raise ClientError("reply.streaming", "Stop this reply before asking again.")
        room, assistant, question = answerable_again(old)
        seq = allocate_seqs(room_id, 1, open_only=True)
        placeholders = create_placeholders(room, question, [assistant], seq, old.recipient)
        jobs = reply_jobs(room, placeholders, question)
        if old.merge_of:  # a merge asked again: merged again, from the same answers
            from collab.chat.actions import merging  # it imports this module

            merging.redo(placeholders[0], jobs[0], old.merge_of)
        return placeholders[0], jobs


async def regenerate_reply(user_id: int, room_id: int, message_id: object) -> None:
    await take_post_token(user_id, room_id)
    reply, jobs = await database_sync_to_async(_store_regenerate)(user_id, room_id, message_id)
    html = rendering.frame_new([reply])
    frame: RoomFrame = {"type": "room.frame", "kind": "new", "msg": reply.id, "replies": [reply.id], "html": html}
    if reply.recipient_id is not None:  # a personal reply asked again: still its recipient's alone
        frame["to"] = reply.recipient_id
    await start_and_announce(jobs, room_id, frame, placeholders=[reply])


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
    html = await sync_to_async(render_markdown, thread_sensitive=False)(text) if text else ""
    if status == Message.Status.INTERRUPTED and not error:
        error = "interrupted: the server running this reply stopped"
    reasoning = view.thinking if view is not None else None
    message = await database_sync_to_async(_store_interrupted)(reply_id, text, status, error, html, reasoning)
    if message is not None:
        await _send_final(message)
