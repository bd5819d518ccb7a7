"""A reply's job (what its model is sent), its placeholder (the streaming row), and its
start: the model request first, then its announcement.

    start_and_announce ─> generation.registry.start(job, RoomSink)   the model request starts
                       ─> shared.begin (text "", owner lease) ─> broadcast "new"   then pieces flow
    then each piece, thought and the outcome go to the reply's sink (replies/sink.py)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import Q

from collab.chat import broadcast, shared
from collab.chat.context import HISTORY_COLUMNS, HISTORY_MESSAGES, HistoryRow, build_context
from collab.chat.events import RoomFrame
from collab.chat.files.for_models import read_files
from collab.chat.generation import ReplyJob, registry
from collab.chat.models import Assistant, Message, Room, room_order
from collab.chat.prepared import Prepared
from collab.chat.replies import agents
from collab.chat.replies.sink import RoomSink
from collab.chat.services import availability, budgets, threads, votes
from collab.chat.services.lenses import personal_lenses
from collab.chat.services.providers import deployment_slots, prices, provider_config

log = logging.getLogger(__name__)

_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII digits only: "²".isdigit() is True, and int("²") fails


def read_history(room: Room, answered: Message) -> list[HistoryRow]:
    """The room's messages up to `answered`, in the order the room shows them: only what
    the context needs, and no more messages than a budget could hold. Shared messages
    only: nobody's personal replies (docs/architecture.md#a-personal-replies); of a reply
    with versions, the one shown alone, in its slot's place (docs/architecture.md#a-versions)."""
    if answered.thread_id is not None:  # in a thread: the thread, not the room (services/threads.py)
        return threads.history_rows(room, answered)
    rows = [HistoryRow._make(row) for row in _HISTORY.values(room.id, answered.seq, answered.seq)[::-1]]
    return sorted(rows, key=room_order)


# Its SQL compiled once (prepared.py): it runs on every post that asks. A version made
# after `answered` whose slot is before it is in its history (the slot's shown version).
_HISTORY = Prepared(
    lambda room_id, seq, slot_seq: (
        Message.objects.filter(
            Q(seq__lte=seq) | Q(slot_seq__lte=slot_seq), room_id=room_id, version_hidden=False, thread__isnull=True
        )
        .shared()
        .order_by("-seq")
        .values_list(*HISTORY_COLUMNS)[:HISTORY_MESSAGES]
    ),  # tuples, not model instances
    3,
)


def reply_jobs(
    room: Room, replies: list[Message], answered: Message, rows: list[HistoryRow] | None = None
) -> list[ReplyJob]:
    """A job per reply; `rows`: the room's history as `read_history` returned it, if read."""
    history = votes.steer(room, read_history(room, answered) if rows is None else rows)
    lenses = personal_lenses(room, replies)
    budgets_of = [_budget(reply.assistant) for reply in replies]
    # The history's files, once for every reply (no query when none of its messages has any).
    files = read_files(history, budgets_of)
    jobs = []
    for reply, budget in zip(replies, budgets_of, strict=True):
        assistant = reply.assistant
        assert assistant is not None
        lens = lenses.get(reply.recipient_id, "")  # "": a shared reply
        jobs.append(
            ReplyJob(
                message_id=reply.id,
                room_id=room.id,
                provider=provider_config(assistant.provider),
                model=assistant.model_name,
                messages=build_context(assistant, room, history, budget, lens, files),
                temperature=assistant.temperature,
                max_tokens=assistant.max_tokens,
                recipient_id=reply.recipient_id,
                agent=agents.plan_for(assistant, room, answered, reply),
                price_per_m=prices(assistant.provider),
            )
        )
    return jobs


def _budget(assistant: Assistant | None) -> int:
    """The characters of history its context may hold."""
    assert assistant is not None
    return int(assistant.provider.context_chars or settings.COLLAB["CONTEXT_CHARS"])


def create_placeholders(
    room: Room,
    answered: Message,
    assistants: list[Assistant],
    first_seq: int,
    recipient: User | None = None,
    lens: str = "",
) -> list[Message]:
    """A streaming placeholder per assistant; with `recipient`, personal replies (`/each`),
    made with `lens` (both kept once shared: the reply's provenance)."""
    if assistants:  # every invocation passes here: none once the room's budget is spent (room.budget),
        budgets.check(room)  # none of an assistant the room may not use (assistant.unavailable)
        availability.check(room, assistants)
    return [
        Message.objects.create(
            room=room,
            seq=first_seq + i,
            role=Message.Role.ASSISTANT,
            assistant=a,
            author_name=a.display_name,
            assistant_handle=a.handle,
            provider_name=a.provider.name,
            reply_to=answered,
            thread_id=answered.thread_id,  # a reply in a thread stays in it (services/threads.py)
            status=Message.Status.STREAMING,
            model=a.model_name,
            recipient=recipient,
            made_for=recipient.get_username() if recipient is not None else "",
            lens=lens if recipient is not None else "",
            agent_steps=0 if a.is_agent else None,  # an agent's run (chat/agent.py)
        )
        for i, a in enumerate(assistants)
    ]


async def start_and_announce(
    jobs: list[ReplyJob], room_id: int, frame: RoomFrame, *more: RoomFrame, placeholders: Sequence[Message] = ()
) -> None:
    """Start the replies' model requests, then announce their articles (`more`: the
    personal replies' own "new" frames, replies/each.py): the announcement overlaps the
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
