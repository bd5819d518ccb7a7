"""Merging the approved parallel answers to one message into one reply (docs/wire.md,
"merge"; docs/architecture.md#a-merge).

    merge        the command (commands/replies.py): the posting rate, the member, the
                 question (a message of this room they can see), the room open; then
    store_merge  in one transaction: the question a person's, the assistant (named, or the
                 room's default: each.py), at least two approved answers
                 (votes.approved_replies), the budget; then a placeholder reply to the
                 question at the next seq, with merge_of = the answers' ids, and its job:
                 the room's history up to the question, then one turn holding each approved
                 answer labelled with its assistant and seq, and the instruction to combine
                 them and cite the ones it drew from; then
    start        the reply starts and is announced as any reply (jobs.start_and_announce)

Nothing is stored and no model is asked when any check fails.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.db import transaction

from collab.chat import frames
from collab.chat.errors import ClientError
from collab.chat.generation import ReplyJob
from collab.chat.models import Assistant, Message, Room
from collab.chat.replies import each
from collab.chat.replies.jobs import create_placeholders, reply_jobs, start_and_announce
from collab.chat.services import availability, budgets, threads, unread, votes
from collab.chat.services.rooms import allocate_seqs
from collab.llm.content import content_chars

_HANDLE = re.compile(r"@?([A-Za-z0-9][A-Za-z0-9_-]{0,31})")

MERGE_PROMPT = (
    "The room approved the answers below to the last message. Combine them into one answer: keep what "
    "they agree on, settle or state plainly where they differ, and drop repetition. Cite the answers you "
    "draw from by their labels, like [#{first}], where you use them."
)


def _check_question(question: Message) -> None:
    if question.role != Message.Role.USER:
        raise ClientError(
            "merge.not_question", "Only a person's message can be merged: merge the answers to the message they answer."
        )
    if question.deleted_at is not None:
        raise ClientError("message.deleted", "This message was deleted; its answers cannot be merged.")


def _assistant(room: Room, handle: object) -> Assistant:
    """The named assistant (it must be in the room), or the room's default one."""
    if handle in (None, ""):
        found = each.default_assistant(room)
        if not found:
            raise ClientError("merge.no_assistant", "No assistant is in this room to merge the answers.")
        return found[0]
    match = _HANDLE.fullmatch(handle) if isinstance(handle, str) else None
    if match is None:
        raise ClientError("merge.invalid_assistant", "assistant must be an assistant's @handle.")
    assistant = room.assistants.select_related("provider").filter(handle__iexact=match.group(1)).first()
    if assistant is None:
        raise ClientError("assistant.unavailable", f"No assistant called @{match.group(1)} is in this room.")
    availability.check(room, [assistant])
    return assistant


def merge_turn(answers: list[Message], budget_chars: int) -> str:
    """The request's last turn: the instruction, then each answer under its label (an
    answer longer than its share of the budget is cut, its end marked)."""
    share = max(1000, budget_chars // (2 * max(1, len(answers))))
    parts = [MERGE_PROMPT.format(first=answers[0].seq)]
    for answer in answers:
        handle = answer.assistant.handle if answer.assistant is not None else "unknown"
        text = answer.text if len(answer.text) <= share else answer.text[:share] + " [… cut]"
        parts.append(f"--- [#{answer.seq}] the answer of @{handle} ({answer.author_name}) ---\n{text}")
    return "\n\n".join(parts)


def merge_job(job: ReplyJob, answers: list[Message], budget_chars: int) -> None:
    """The job's messages: its history, oldest turns dropped (never the system prompt nor
    the question) so that the history and the answers fit the budget, then the answers."""
    turn = merge_turn(answers, budget_chars)
    messages = list(job.messages)
    while len(messages) > 2 and sum(content_chars(m) for m in messages) + len(turn) > budget_chars:
        del messages[1]
    job.messages = [*messages, {"role": "user", "content": turn}]


def redo(reply: Message, job: ReplyJob, sources: list[int]) -> None:
    """A merge asked again (regenerate: `reply` is its new placeholder) or continued
    (replies/continuation.py): the same answers it drew from, those still there, labelled
    as before, in the job's request; its merge_of kept. Fewer than two left:
    merge.not_enough (raised inside the caller's transaction: nothing stored)."""
    answers = list(
        Message.objects.filter(pk__in=sources, room_id=reply.room_id, deleted_at__isnull=True)
        .exclude(verdict=votes.REJECTED)  # the room voted it down since: not sent again
        .shared()
        .exclude(text="")
        .select_related("assistant")
        .order_by("seq")
    )
    if len(answers) < 2:
        raise ClientError("merge.not_enough", "Fewer than two of the answers this merge drew from are left.")
    if reply.merge_of != [a.id for a in answers] or reply.merge_seqs != [a.seq for a in answers]:
        reply.merge_of, reply.merge_seqs = [a.id for a in answers], [a.seq for a in answers]
        reply.save(update_fields=["merge_of", "merge_seqs"])
    assert reply.assistant is not None
    merge_job(job, answers, reply.assistant.provider.context_chars or settings.COLLAB["CONTEXT_CHARS"])


def store_merge(room: Room, question: Message, handle: object) -> tuple[Message, ReplyJob]:
    """The merge's placeholder and job (database thread); `question`: the message whose
    answers are merged, resolved by the merge command in `room`."""
    with transaction.atomic():
        _check_question(question)
        assistant = _assistant(room, handle)
        answers = votes.approved_replies(question)  # ended, shared, with a text, in seq order
        if len(answers) < 2:
            raise ClientError(
                "merge.not_enough",
                f"A merge needs at least two approved answers to this message; it has {len(answers)}.",
            )
        budgets.check(room)  # a spent monthly budget: nothing stored, no provider call (room.budget)
        seq = allocate_seqs(room.pk, 1, open_only=True)
        (reply,) = create_placeholders(room, question, [assistant], seq)
        reply.merge_of, reply.merge_seqs = [a.id for a in answers], [a.seq for a in answers]
        reply.save(update_fields=["merge_of", "merge_seqs"])
        (job,) = reply_jobs(room, [reply], question)
        merge_job(job, answers, assistant.provider.context_chars or settings.COLLAB["CONTEXT_CHARS"])
        if reply.thread_id is not None:  # a merge in a thread: one more there (services/threads.py)
            reply.thread = threads.recount(reply.thread_id)
        return reply, job


async def start(reply: Message, job: ReplyJob) -> None:
    """The merge streams to the room as a reply to its question (docs/wire.md, "merge")."""
    parent = reply.thread if reply.thread_id is not None else None
    frame = frames.new(reply.id, threads.frame_new([reply], parent), [reply.id], thread=reply.thread_id)
    await start_and_announce([job], reply.room_id, frame, placeholders=[reply])
    await unread.announce(reply.room_id, [reply])
