"""Continuing a reply cut off at the token limit (finish_reason "length"): one click,
a regenerate that continues (docs/wire.md, "continue").

The same reply streams again, from where it stopped, for everyone who sees it:

    store_continue    the checks of a regenerate; `done` + "length" -> `streaming` (one step:
                      a second click finds it streaming); the job: the history up to the
                      question, the partial answer as the assistant's turn, an instruction
    start             the model request starts; the shared record begins holding the text
                      (and thinking) so far; then its article is sent again, streaming, as a
                      `final` frame with `resume` = [text length, thinking length]: every
                      socket's floors move there (consumers.take_frame), and the pieces that
                      follow continue at those offsets (ContinuationSink)
    finish            the text, thinking, tokens and cost stored are the whole reply's
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from collab.chat import broadcast, frames, rendering, shared
from collab.chat.errors import ClientError
from collab.chat.generation import Outcome, ReplyJob, registry
from collab.chat.models import Message
from collab.chat.replies import merging
from collab.chat.replies.again import answerable_again
from collab.chat.replies.jobs import reply_jobs
from collab.chat.replies.sink import RoomSink
from collab.chat.services import budgets
from collab.chat.services.providers import deployment_slots
from collab.llm.client import ChatMessage
from collab.llm.content import prompt_estimate

log = logging.getLogger(__name__)

# The last turn of a continuation's request, after the partial answer (the assistant's turn).
CONTINUE_PROMPT = (
    "Your previous answer was cut off at the token limit. Continue it exactly where it stopped: "
    "do not repeat anything, do not start over, begin with the next word."
)


class ContinuationSink(RoomSink):
    """A RoomSink whose reply already holds `text` and `reasoning`: its pieces (and
    thoughts) go on from their ends, and its outcome is the whole reply's."""

    def __init__(self, job: ReplyJob, text: str, reasoning: str, tokens: int, prompt_tokens: int) -> None:
        super().__init__(job)
        self.base, self.thinking_base = len(text), len(reasoning)
        self.pieces = [text] if text else []
        self.thinking = [reasoning] if reasoning else []
        self.shared_bytes, self.thinking_bytes = len(text.encode()), len(reasoning.encode())
        self.before = (text, reasoning, tokens, prompt_tokens)

    async def piece(self, offset: int, text: str) -> None:
        await super().piece(self.base + offset, text)

    async def thought(self, offset: int, text: str) -> None:
        await super().thought(self.thinking_base + offset, text)

    async def finish(self, outcome: Outcome) -> None:
        text, reasoning, tokens, prompt_tokens = self.before
        if outcome.status != "done" and not outcome.text:
            # Stopped or failed before a word more: the reply stays as it was, cut off, and
            # can be continued again (the members saw nothing new).
            log.warning("continuation of reply %s ended %s: %s", self.job.message_id, outcome.status, outcome.error)
            outcome.status, outcome.error, outcome.finish_reason = "done", "", "length"
        if outcome.prompt_tokens is None:  # the provider sent no usage: ~4 characters a token
            outcome.prompt_tokens = prompt_estimate(self.job.messages)
        outcome.text = text + outcome.text
        outcome.reasoning = reasoning + outcome.reasoning
        outcome.tokens += tokens  # both requests' tokens: the reply's usage and cost
        outcome.prompt_tokens += prompt_tokens
        await super().finish(outcome)


def store_continue(reply: Message) -> tuple[Message, ReplyJob, int, int]:
    """The checks of a regenerate (again.py), then the reply streaming again (database
    thread); `reply`: as the continue command resolved it."""
    with transaction.atomic():
        if reply.status == Message.Status.STREAMING:
            raise ClientError("reply.streaming", "This reply is still being written.")
        if reply.status != Message.Status.DONE or reply.finish_reason != "length":
            raise ClientError("reply.not_cut_off", "Only a reply cut off at the token limit can be continued.")
        room, _assistant, question = answerable_again(reply)
        budgets.check(room)  # a spent monthly budget: no provider call (room.budget)
        tokens, prompt_tokens = reply.tokens or 0, reply.prompt_tokens or 0
        again = Message.objects.filter(pk=reply.pk, status=Message.Status.DONE, finish_reason="length")
        restarted = timezone.now()  # the orphan sweep's grace counts from here (lifecycle._unleased_candidates)
        if not again.update(
            status=Message.Status.STREAMING, finish_reason="", error="", finished_at=None, restarted_at=restarted
        ):
            raise ClientError("reply.streaming", "This reply is still being written.")
        reply.status, reply.finish_reason, reply.error, reply.finished_at = Message.Status.STREAMING, "", "", None
        job = reply_jobs(room, [reply], question)[0]
        job.agent = None  # a continuation goes on with the text, never as a new agent run
        if reply.merge_of:  # a merge goes on from the answers it drew from (replies/merging.py)
            merging.redo(reply, job, reply.merge_of)
        # A reply cut off while it was still thinking has no answer yet: no empty assistant turn.
        partial: list[ChatMessage] = [{"role": "assistant", "content": reply.text}] if reply.text else []
        job.messages = [*job.messages, *partial, {"role": "user", "content": CONTINUE_PROMPT}]
        return reply, job, tokens, prompt_tokens


def _tail(text: str) -> int:
    """Where an announced text starts so that its article stays within a frame's budget
    (at most 6 bytes a character once escaped): 0 for any text of a usual length."""
    return max(0, len(text) - rendering.budget("FRAME_ARTICLE_BYTES") // 6)


async def start(reply: Message, job: ReplyJob, tokens: int, prompt_tokens: int) -> None:
    """Stream the reply again from where it stopped, for everyone who sees it."""
    room_id = reply.room_id
    text, reasoning = reply.text, reply.reasoning
    sink = ContinuationSink(job, text, reasoning, tokens, prompt_tokens)
    start, t_start = _tail(text), _tail(reasoning)
    html = rendering.article(
        reply,
        live_text=text[start:],
        live_from=start,
        oob=True,
        live_thinking=reasoning[t_start:],
        thinking_from=t_start,
    ).strip()
    # A personal reply: its recipient's sockets only.
    frame = frames.final(reply.id, html, to=reply.recipient_id, resume=[len(text), len(reasoning)])
    # As start_and_announce: the model request first, then the record and the article;
    # no piece is sent before the article (sink.announced).
    registry.start(job, sink, slots=deployment_slots)
    try:
        state = shared.backend()
        await state.begin(reply.id, room_id, shared.PROCESS_ID)
        await state.restore(reply.id, room_id, shared.PROCESS_ID, text, "", reasoning)
        await broadcast.to_room(room_id, frame)
    finally:
        sink.announced.set()
