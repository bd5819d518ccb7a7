"""A reply's sink: what the streaming engine hands each piece, thought and outcome to.

    RoomSink.piece     ─> shared.append ─> broadcast "delta"        (in that order: see snapshot)
    RoomSink.thought   ─> shared.append(thinking) ─> broadcast the thinking's "delta"
    RoomSink.finish    ─> database (only if still streaming) ─> broadcast "final" ─> shared.end

It keeps the live text in the shared state, a checkpoint in the database at most
CHECKPOINT_S behind, and stores how the reply ended (docs/architecture.md#a-reconnects).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from decimal import Decimal

from channels.db import database_sync_to_async
from django.db import models
from django.utils import timezone

from collab.chat import broadcast, frames, rendering, shared
from collab.chat.generation import Outcome, ReplyJob
from collab.chat.markup import arender_markdown, log_markdown
from collab.chat.models import Message
from collab.chat.prepared import Prepared, PreparedUpdate
from collab.chat.replies import early
from collab.chat.services import budgets
from collab.chat.services.providers import reply_cost
from collab.llm.content import prompt_estimate

log = logging.getLogger(__name__)

CHECKPOINT_S = 1.0  # a streaming reply's text is in the database at most this far behind
_COST = Message._meta.get_field("cost")
assert isinstance(_COST, models.DecimalField)
_COST_PLACES = Decimal(1).scaleb(-_COST.decimal_places)  # the cost as its column holds it (1E-6)


class RoomSink:
    """Where one reply's pieces, states and outcome go (generation.Sink).

    It keeps every piece it was handed (the text so far), so that nothing depends on the
    shared state or the channel layer staying up: a piece that cannot be recorded or sent
    is kept, the shared record is put back whole once it can be (`restore`), and the
    database holds a checkpoint of the text at most CHECKPOINT_S behind while it streams.
    """

    def __init__(self, job: ReplyJob, placeholder: Message | None = None) -> None:
        self.job = job
        self.placeholder = placeholder  # the reply as its post created it: its final reads less (_as_stored)
        # Set once the reply's article has been broadcast: its first piece must not overtake
        # it. The model request starts before that, so the broadcast overlaps its first token.
        self.announced = asyncio.Event()
        self.pieces: list[str] = []
        self.thinking: list[str] = []  # a reasoning model's thinking so far (sink.thought)
        self.thinking_bytes = 0  # how much of it (UTF-8) the shared record holds
        self.label = ""
        self.lost = False  # the shared record is missing or stale: restore it before the next piece
        self.shared_bytes = 0  # how much of the text (UTF-8) the shared record holds
        self._checkpoint_at = asyncio.get_running_loop().time()
        self._checkpoint: asyncio.Task[None] | None = None
        self._shared = asyncio.Lock()

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    async def piece(self, offset: int, text: str) -> None:
        if not self.announced.is_set():
            await self.announced.wait()
        reply_id, room_id = self.job.message_id, self.job.room_id
        # The shared text first, then the frame: a member who joins the room's group and
        # then reads the text gets every piece exactly once (consumers.RoomConsumer.floors).
        html = rendering.frame_delta(reply_id, offset, text)
        frame = frames.delta(reply_id, offset, len(text), html, to=self.job.recipient_id)
        async with self._shared:  # one append or restore at a time: the answer's and the thinking's
            self.pieces.append(text)  # inside: a restore meanwhile must not hold this piece already
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

    async def thought(self, offset: int, text: str) -> None:
        """A piece of the thinking: as `piece`, into a text and frames of its own
        (`msg-N-thinking`; the frame's `msg` is -N, its own floor: consumers.take_frame)."""
        if not self.announced.is_set():
            await self.announced.wait()
        reply_id = self.job.message_id
        html = rendering.frame_thinking(reply_id, offset, text)
        frame = frames.delta(-reply_id, offset, len(text), html, to=self.job.recipient_id)
        async with self._shared:  # one append or restore at a time: the answer's and the thinking's
            self.thinking.append(text)
            try:
                if not self.lost:
                    try:
                        await broadcast.piece_to_room(
                            self.job.room_id, reply_id, text, self.thinking_bytes, frame, thinking=True
                        )
                        self.thinking_bytes += len(text.encode())
                        return
                    except shared.StateLost:
                        self.lost = True
                await self.restore_shared()
                await broadcast.to_room(self.job.room_id, frame)
            except shared.ReplyEnded:
                raise
            except Exception as exc:  # Redis away: kept, restored later (as `piece`)
                if not self.lost:
                    log.warning("reply %s: thinking not shared (%r); kept, restored later", reply_id, exc)
                self.lost = True
            finally:
                self._maybe_checkpoint()  # a long thinking is checkpointed too

    async def restore_locked(self) -> None:
        """restore_shared, from outside the sink's own pieces (the heartbeat, after the
        shared state restarted): one append or restore at a time."""
        async with self._shared:
            await self.restore_shared()

    async def restore_shared(self) -> None:
        """Put the reply's shared record back whole (Redis lost it, or holds another text)."""
        text, thinking = self.text, "".join(self.thinking)
        await shared.backend().restore(
            self.job.message_id, self.job.room_id, shared.PROCESS_ID, text, self.label, thinking
        )
        self.shared_bytes = len(text.encode())
        self.thinking_bytes = len(thinking.encode())
        self.lost = False

    def _maybe_checkpoint(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() - self._checkpoint_at < CHECKPOINT_S:
            return
        if self._checkpoint is not None and not self._checkpoint.done():
            return
        self._checkpoint_at = loop.time()
        self._checkpoint = loop.create_task(self._store_checkpoint(self.text, "".join(self.thinking)))

    async def _store_checkpoint(self, text: str, reasoning: str = "") -> None:
        try:
            await database_sync_to_async(_store_text)(self.job.message_id, text, reasoning)
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
            frame = frames.other(html, msg=reply_id, to=self.job.recipient_id)
            await broadcast.to_room(self.job.room_id, frame)
        except Exception:  # a label is not worth failing the reply for
            log.warning("could not show state %r of reply %s", text, reply_id, exc_info=True)

    async def finish(self, outcome: Outcome) -> None:
        """Store the reply's final text, status and metrics, then send its article whole
        (never before the article was announced: a final for an unknown article is lost)."""
        try:
            if self._checkpoint is not None:
                await asyncio.shield(self._checkpoint)  # the final text is stored after it, never under it
            html = await arender_markdown(outcome.text) if outcome.text else ""
            log_html = ""  # an agent's log: rendered once, at its end (a reasoning model's thinking stays text)
            if outcome.steps is not None and outcome.reasoning:
                log_html = await arender_markdown(log_markdown(outcome.reasoning))
            message = await database_sync_to_async(_store_outcome)(self.job, outcome, html, self.placeholder, log_html)
            await self.announced.wait()
            if message is not None:
                await send_final(message)
        finally:
            await shared.backend().end(self.job.message_id)


def _store_text(reply_id: int, text: str, reasoning: str = "") -> None:
    """A checkpoint of a streaming reply's text (what a restart without the shared state keeps)."""
    _STREAMING.run({"text": text, "reasoning": reasoning}, reply_id)


def _store_outcome(
    job: ReplyJob, outcome: Outcome, html: str, placeholder: Message | None = None, log_html: str = ""
) -> Message | None:
    """Store how the reply ended, unless another process already ended it (it
    interrupted a reply whose lease had run out) or it was deleted: then None. Two
    statements: the update, then what changed meanwhile (`_as_stored`) for its final
    article. `placeholder`: the reply as its post created it, if at hand."""
    if outcome.prompt_tokens is None:  # the provider sent no usage: ~4 characters a token
        outcome.prompt_tokens = prompt_estimate(job.messages)
    # As the column holds it (6 places): the final article is rendered from this value (_as_stored).
    cost = reply_cost(job.price_per_m, outcome.prompt_tokens, outcome.tokens).quantize(_COST_PLACES)
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
        "reasoning": outcome.reasoning,
        "reasoning_html": log_html,
        "finish_reason": outcome.finish_reason,
    }
    if outcome.steps is not None:  # an agent's run
        fields["agent_steps"] = outcome.steps
    if not _STREAMING.run(fields, job.message_id):
        log.warning(
            "reply %s was already ended elsewhere (or deleted); its outcome %s is not stored",
            job.message_id,
            outcome.status,
        )
        return None
    message = _as_stored(job.message_id, fields, placeholder)
    if message is not None:
        early.ended(message)  # the room's history as this process knows it (chat/replies/early.py)
    return message


# A reply still streaming, the one its checkpoints and its end write to, that write's SQL
# compiled once (prepared.py): every reply's end, and a long reply's every second.
_STREAMING = PreparedUpdate(lambda reply_id: Message.objects.filter(pk=reply_id, status=Message.Status.STREAMING), 1)

# What may change in a reply's row while it streams, besides what its end writes: the votes
# cast meanwhile, a tombstone, a personal reply shared with the room, its question deleted
# by staff (the admin's delete: reply_to is SET_NULL), its versions (it was asked again, or another shown),
# a thread opened on it (services/threads.py: its "N replies" line).
_MEANWHILE = (
    *("votes_up", "votes_down", "verdict", "votes_by", "edited_at", "deleted_at", "recipient_id", "reply_to_id"),
    *("versions", "version_hidden", "thread_replies", "thread_last_at"),
    "reactions",  # given while it streamed (commands/reactions.py)
)
# That read, with the question's edit, its SQL compiled once (prepared.py): every reply's end.
_CHANGED = Prepared(
    lambda reply_id: Message.objects.filter(pk=reply_id).values_list(*_MEANWHILE, "reply_to__edited_at")[:1], 1
)


def _as_stored(reply_id: int, fields: dict[str, object], placeholder: Message | None) -> Message | None:
    """The reply as stored, for its final article. From the placeholder the post created
    (its question, assistant and recipient loaded with it) and one narrow read of what may
    have changed meanwhile, the question's edit among it (rendering.answers_edited): a
    fraction of reading the row again with its three relations
    (docs/benchmarks/2026-12-04.md#b-post-statements). Read
    whole when there is no placeholder, or it was deleted, shared or orphaned meanwhile."""
    if placeholder is not None:
        found = _CHANGED.values(reply_id)
        if not found:
            return None  # deleted just now
        *meanwhile, question_edited = found[0]
        changed = dict(zip(_MEANWHILE, meanwhile, strict=True))
        loaded = Message.reply_to.is_cached(placeholder) and Message.recipient.is_cached(placeholder)
        same = all(changed[k] == getattr(placeholder, k) for k in ("recipient_id", "reply_to_id"))
        if loaded and same and changed["deleted_at"] is None:
            message = copy.copy(placeholder)  # the post's own instance is left as it was
            for name, value in (*fields.items(), *changed.items()):
                setattr(message, name, value)
            if message.reply_to is not None:
                question = copy.copy(message.reply_to)
                question.edited_at = question_edited
                message.reply_to = question
            return message
    # Votes cast while it streamed (or just now) are counted in its final article, as stored.
    # reply_to: its final article says whether it answers a since-edited question (rendering.answers_edited)
    return Message.objects.select_related("recipient", "reply_to").filter(pk=reply_id).first()


async def send_final(message: Message) -> None:
    html = rendering.frame_final(message)
    # A personal reply: its recipient's sockets only.
    frame = frames.final(message.id, html, to=message.recipient_id, thread=message.thread_id)
    await broadcast.to_room(message.room_id, frame)
    # What is left, live: rooms with a budget only (one this process knows has none: no read).
    await budgets.announce(message.room_id, unlimited=early.known_unlimited(message.room_id))
