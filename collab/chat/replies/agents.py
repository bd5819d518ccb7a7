"""Agents in a room: an agent assistant's plan and tools for one run, and the review
of one assistant's answer by another (`@critic review @planner`, docs/wire.md "agents").

The run itself is chat/agent.py (pure); the tools are replies/tools.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from collab.chat.agent import AgentPlan
from collab.chat.generation import ReplyJob
from collab.chat.models import Assistant, Message, Room
from collab.chat.replies.tools import toolbox_for
from collab.llm.content import with_text

# `@critic review @planner`: the first reviews the second's latest answer; only the first is asked.
_REVIEW = re.compile(r"@([A-Za-z0-9_-]{1,32})\s+review\s+@([A-Za-z0-9_-]{1,32})", re.IGNORECASE)


def plan_for(assistant: Assistant, room: Room, answered: Message, reply: Message) -> AgentPlan | None:
    """The run's budget and tools if `assistant` is an agent, else None (a plain reply)."""
    if not assistant.is_agent:
        return None
    # The tools read for whoever will see the run: a personal reply's recipient (`/each`),
    # else the member who asked (their own personal replies are theirs to show).
    asker = reply.recipient if reply.recipient_id is not None else answered.author
    return AgentPlan(
        steps=assistant.agent_steps,
        tokens=assistant.agent_tokens,
        tools=toolbox_for(assistant, room, asker, reply),
    )


@dataclass(frozen=True)
class Review:
    """`@reviewer review @reviewed`: who is asked, and whose answer they are given."""

    reviewer: Assistant
    reviewed: Assistant


def review_of(text: str, assistants: list[Assistant]) -> Review | None:
    """The first `@a review @b` in `text` where both are this room's assistants (and differ)."""
    by_handle = {a.handle.lower(): a for a in assistants}
    for match in _REVIEW.finditer(text):
        reviewer, reviewed = by_handle.get(match[1].lower()), by_handle.get(match[2].lower())
        if reviewer is not None and reviewed is not None and reviewer.id != reviewed.id:
            return Review(reviewer, reviewed)
    return None


def reviewed_answer(room: Room, review: Review, before_seq: int) -> Message | None:
    """The reviewed assistant's latest finished shared answer in the room before the request."""
    return (
        Message.objects.filter(
            room=room, assistant=review.reviewed, seq__lt=before_seq, status=Message.Status.DONE, deleted_at=None
        )
        .shared()
        .exclude(text="")
        .order_by("-seq")
        .first()
    )


def review_input(answer: Message | None, review: Review) -> str:
    """What the reviewer is given after the request: the reviewed answer, whole, or a note."""
    if answer is None:
        return f"(@{review.reviewed.handle} has no finished answer in this room to review.)"
    return f"The answer of @{review.reviewed.handle} (message #{answer.seq}) to review:\n\n{answer.text}"


def give_review(jobs: list[ReplyJob], room: Room, review: Review, request: Message) -> None:
    """Append the reviewed answer to the request each reviewer's job sends to its model."""
    extra = review_input(reviewed_answer(room, review, request.seq), review)
    for job in jobs:
        last = job.messages[-1]
        job.messages[-1] = {**last, "content": with_text(last.get("content"), extra)}
