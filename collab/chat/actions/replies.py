"""Replies: start them, give each a sink that keeps its live text in the shared state
and sends its frames, store how each ended, and stop, regenerate or interrupt them
from any process.

    start_and_announce ─> generation.registry.start(job, RoomSink)   the model request starts
                       ─> shared.begin (text "", owner lease) ─> broadcast "new"   then pieces flow
    RoomSink.piece     ─> shared.append ─> broadcast "delta"        (in that order: see snapshot)
    RoomSink.finish    ─> database (only if still streaming) ─> broadcast "final" ─> shared.end
"""

from __future__ import annotations

import asyncio
import logging
import re

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from collab.chat import broadcast, rendering, shared
from collab.chat.actions.providers import deployment_slots, provider_config, reply_cost
from collab.chat.actions.rooms import allocate_seqs, check_open, take_post_token
from collab.chat.context import build_context
from collab.chat.errors import ClientError
from collab.chat.events import RoomFrame
from collab.chat.generation import Outcome, ReplyJob, registry
from collab.chat.markup import render_markdown
from collab.chat.models import Assistant, Membership, Message, Room

log = logging.getLogger(__name__)

CHECKPOINT_S = 1.0  # a streaming reply's text is in the database at most this far behind
_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII digits only: "²".isdigit() is True, and int("²") fails

__all__ = ["ReplyJob", "RoomSink", "interrupt", "regenerate_reply", "start_and_announce", "stop_reply"]


def reply_jobs(room: Room, replies: list[Message], answered: Message) -> list[ReplyJob]:
    # Only what the context needs, and no more messages than a budget could hold.
    recent = Message.objects.filter(room=room, seq__lte=answered.seq).order_by("-seq")
    fields = ("seq", "role", "status", "text", "author_name", "assistant_id")
    history = list(recent.only(*fields)[:60])[::-1]
    jobs = []
    for reply in replies:
        assistant = reply.assistant
        assert assistant is not None
        budget = assistant.provider.context_chars or settings.COLLAB["CONTEXT_CHARS"]
        jobs.append(
            ReplyJob(
                message_id=reply.id,
                room_id=room.id,
                provider=provider_config(assistant.provider),
                model=assistant.model_name,
                messages=build_context(assistant, room, history, budget),
                temperature=assistant.temperature,
                max_tokens=assistant.max_tokens,
            )
        )
    return jobs


def create_placeholders(room: Room, answered: Message, assistants: list[Assistant], first_seq: int) -> list[Message]:
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
        )
        for i, a in enumerate(assistants)
    ]


class RoomSink:
    """Where one reply's pieces, states and outcome go (generation.Sink).

    It keeps every piece it was handed (the text so far), so that nothing depends on the
    shared state or the channel layer staying up: a piece that cannot be recorded or sent
    is kept, the shared record is put back whole once it can be (`restore`), and the
    database holds a checkpoint of the text at most CHECKPOINT_S behind while it streams.
    """

    def __init__(self, job: ReplyJob) -> None:
        self.job = job
        # Set once the reply's article has been broadcast: its first piece must not overtake
        # it. The model request starts before that, so the broadcast overlaps its first token.
        self.announced = asyncio.Event()
        self.pieces: list[str] = []
        self.label = ""
        self.lost = False  # the shared record is missing or stale: restore it before the next piece
        self.shared_bytes = 0  # how much of the text (UTF-8) the shared record holds
        self._checkpoint_at = asyncio.get_running_loop().time()
        self._checkpoint: asyncio.Task[None] | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    async def piece(self, offset: int, text: str) -> None:
        if not self.announced.is_set():
            await self.announced.wait()
        self.pieces.append(text)
        reply_id, room_id = self.job.message_id, self.job.room_id
        # The shared text first, then the frame: a member who joins the room's group and
        # then reads the text gets every piece exactly once (consumers.RoomConsumer.floors).
        html = rendering.frame_delta(reply_id, offset, text)
        frame: RoomFrame = {
            "type": "room.frame",
            "kind": "delta",
            "msg": reply_id,
            "offset": offset,
            "end": offset + len(text),
            "html": html,
        }
        try:
            if not self.lost:
                try:
                    await broadcast.piece_to_room(room_id, reply_id, text, self.shared_bytes, frame)
                    self.shared_bytes += len(text.encode())
                    return
                except shared.StateLost:
                    self.lost = True
            await self.restore_shared()
            log.warning("reply %s: shared record restored at %d characters", reply_id, len(self.text))
            await broadcast.to_room(room_id, frame)
        except shared.ReplyEnded:
            raise  # another process ended it: no further piece (the engine stops emitting)
        except Exception as exc:  # Redis away: keep the text; members converge when it is back
            if not self.lost:
                log.warning("reply %s: piece not shared (%r); kept, restored later", reply_id, exc)
            self.lost = True
        finally:
            self._maybe_checkpoint()

    async def restore_shared(self) -> None:
        """Put the reply's shared record back whole (Redis lost it, or holds another text)."""
        text = self.text
        await shared.backend().restore(self.job.message_id, self.job.room_id, shared.PROCESS_ID, text, self.label)
        self.shared_bytes = len(text.encode())
        self.lost = False

    def _maybe_checkpoint(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() - self._checkpoint_at < CHECKPOINT_S:
            return
        if self._checkpoint is not None and not self._checkpoint.done():
            return
        self._checkpoint_at = loop.time()
        self._checkpoint = loop.create_task(self._store_checkpoint(self.text))

    async def _store_checkpoint(self, text: str) -> None:
        try:
            await database_sync_to_async(_store_text)(self.job.message_id, text)
        except Exception:
            log.warning("could not checkpoint reply %s", self.job.message_id, exc_info=True)

    async def state(self, text: str) -> None:
        if not self.announced.is_set():  # a label for an article nobody has yet is lost
            await self.announced.wait()
        self.label = text
        reply_id = self.job.message_id
        try:
            await shared.backend().set_state(reply_id, text)
            html = rendering.frame_state(reply_id, text)
            await broadcast.to_room(
                self.job.room_id, {"type": "room.frame", "kind": "other", "msg": reply_id, "html": html}
            )
        except Exception:  # a label is not worth failing the reply for
            log.warning("could not show state %r of reply %s", text, reply_id, exc_info=True)

    async def finish(self, outcome: Outcome) -> None:
        """Store the reply's final text, status and metrics, then send its article whole
        (never before the article was announced: a final for an unknown article is lost)."""
        try:
            if self._checkpoint is not None:
                await asyncio.shield(self._checkpoint)  # the final text is stored after it, never under it
            html = await sync_to_async(render_markdown, thread_sensitive=False)(outcome.text) if outcome.text else ""
            message = await database_sync_to_async(_store_outcome)(self.job, outcome, html)
            await self.announced.wait()
            if message is not None:
                await _send_final(message)
        finally:
            await shared.backend().end(self.job.message_id)


def _store_text(reply_id: int, text: str) -> None:
    """A checkpoint of a streaming reply's text (what a restart without the shared state keeps)."""
    Message.objects.filter(pk=reply_id, status=Message.Status.STREAMING).update(text=text)


def _store_outcome(job: ReplyJob, outcome: Outcome, html: str) -> Message | None:
    """Store how the reply ended, unless another process already ended it (it
    interrupted a reply whose lease had run out): then None."""
    message = Message.objects.select_related("assistant__provider").filter(pk=job.message_id).first()
    if message is None:
        return None
    if outcome.prompt_tokens is None:  # the provider sent no usage: ~4 characters a token
        outcome.prompt_tokens = sum(len(m["content"]) for m in job.messages) // 4
    cost = reply_cost(message.assistant.provider, outcome.prompt_tokens, outcome.tokens) if message.assistant else None
    fields = {
        "text": outcome.text,
        "html": html,
        "status": outcome.status,
        "error": outcome.error[:500],
        "finished_at": timezone.now(),
        "ttft_ms": outcome.ttft_ms,
        "tokens": outcome.tokens,
        "prompt_tokens": outcome.prompt_tokens,
        "duration_ms": outcome.duration_ms,
        "tps": outcome.tps,
        "cost": cost,
    }
    if not Message.objects.filter(pk=message.pk, status=Message.Status.STREAMING).update(**fields):
        log.warning(
            "reply %s was already ended elsewhere; its outcome %s is not stored", job.message_id, outcome.status
        )
        return None
    for name, value in fields.items():
        setattr(message, name, value)
    return message


async def _send_final(message: Message) -> None:
    await broadcast.to_room(
        message.room_id,
        {"type": "room.frame", "kind": "final", "msg": message.id, "html": rendering.frame_final(message)},
    )


async def start_and_announce(jobs: list[ReplyJob], room_id: int, frame: RoomFrame) -> None:
    """Start the replies' model requests, then announce their articles: the announcement
    overlaps the model's time to first token, and no piece is sent before it."""
    sinks = [RoomSink(job) for job in jobs]
    for job, sink in zip(jobs, sinks, strict=True):
        registry.start(job, sink, slots=deployment_slots)
    try:
        state = shared.backend()
        for job in jobs:
            await state.begin(job.message_id, room_id, shared.PROCESS_ID)
        await broadcast.to_room(room_id, frame)
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
        Message.objects.select_related("reply_to", "assistant__provider", "room")
        .filter(pk=int(message_id), room_id=room_id, role=Message.Role.ASSISTANT)
        .first()
    )
    if message is None:
        raise ClientError("message.not_found", "There is no such reply in this room.")
    return message, membership


def _check_stop(user_id: int, room_id: int, message_id: object, address: str | None) -> Message:
    message, membership = _reply_in_room(user_id, room_id, message_id)
    asker = message.reply_to.author_id if message.reply_to else None
    if user_id != asker and not membership.moderates:
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


def _store_regenerate(user_id: int, room_id: int, message_id: object) -> tuple[Message, list[ReplyJob]]:
    with transaction.atomic():
        old, _ = _reply_in_room(user_id, room_id, message_id)
        if old.status == Message.Status.STREAMING:
            raise ClientError("reply.streaming", "Stop this reply before asking again.")
        room = old.room
        check_open(room)
        assistant = old.assistant
        if assistant is None or not room.assistants.filter(pk=assistant.pk).exists():
            raise ClientError("assistant.unavailable", "That assistant is no longer in this room.")
        if old.reply_to is None:
            raise ClientError("message.not_found", "The question this reply answered is gone.")
        seq = allocate_seqs(room_id, 1, open_only=True)
        placeholders = create_placeholders(room, old.reply_to, [assistant], seq)
        return placeholders[0], reply_jobs(room, placeholders, old.reply_to)


async def regenerate_reply(user_id: int, room_id: int, message_id: object) -> None:
    await take_post_token(user_id, room_id)
    reply, jobs = await database_sync_to_async(_store_regenerate)(user_id, room_id, message_id)
    html = rendering.frame_new([reply])
    frame: RoomFrame = {"type": "room.frame", "kind": "new", "msg": reply.id, "replies": [reply.id], "html": html}
    await start_and_announce(jobs, room_id, frame)


def _store_interrupted(reply_id: int, text: str | None, status: str, error: str, html: str | None) -> Message | None:
    message = Message.objects.filter(pk=reply_id).first()
    if message is None:
        return None
    fields = {"status": status, "error": error, "finished_at": timezone.now()}
    if text is not None:
        fields.update(text=text, html=html or "")
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
    message = await database_sync_to_async(_store_interrupted)(reply_id, text, status, error, html)
    if message is not None:
        await _send_final(message)
