"""What votes on assistants' replies decide (docs/wire.md, "vote"; docs/architecture.md#a-votes):
a reply's verdict, the approved answers a merge takes, and the history an
assistant is sent. The vote itself is commands/votes.py; its bar, votebar.py.

Verdicts: "rejected" when down > up; "approved" when the room's rule passes:
    Room.approval "voters": up > down and up >= 1;
    Room.approval "online": up > half the members online when the vote is counted (at
        each vote, with the room's online list then: the vote "closes" at every count).
A reply still streaming keeps its votes and verdict; they count once it ends (history
never holds a streaming reply, and its final article shows them).
"""

from __future__ import annotations

from typing import TypeVar

from collab.chat.context import HistoryRow
from collab.chat.models import Message, Room

APPROVED = "approved"
REJECTED = "rejected"


# --- what the votes decide -------------------------------------------------------------------


def verdict_of(room: Room, up: int, down: int, online: int) -> str:
    """The verdict of `up` and `down` votes under the room's rule; `online`: how many of
    its members are online now (the "online" rule's denominator)."""
    if down > up:
        return REJECTED
    if room.approval == Room.Approval.ONLINE:
        return APPROVED if up >= 1 and up * 2 > max(online, 1) else ""
    return APPROVED if up > down and up >= 1 else ""


def approved_replies(answered: Message) -> list[Message]:
    """The approved, ended, shared replies to one user message, in seq order (merge); of
    a reply's versions, the one shown (docs/architecture.md#a-versions)."""
    return list(
        Message.objects.filter(reply_to=answered, role=Message.Role.ASSISTANT, verdict=APPROVED, version_hidden=False)
        .exclude(status=Message.Status.STREAMING)
        .shared()
        .filter(deleted_at__isnull=True, merge_of=[])  # a merge is not one of the answers
        .exclude(text="")
        .select_related("assistant")
        .order_by("seq")
    )


_S = TypeVar("_S", Message, HistoryRow)


def steer(room: Room, history: list[_S]) -> list[_S]:
    """The history an assistant is sent, as the room's votes steer it: rejected replies
    out (when Room.rejected_left_out), and among the parallel answers to one message,
    the unvoted ones out once any sibling is approved. `history`: Messages, or the
    rows replies.reply_jobs reads (context.HistoryRow)."""
    # Only an approved reply that has ended with a text stands in for its siblings: one
    # streaming again (continued) or empty would leave the question with no answer at all.
    approved_to = {
        m.reply_to_id
        for m in history
        if m.role == Message.Role.ASSISTANT
        and m.verdict == APPROVED
        and m.status != Message.Status.STREAMING
        and m.text
    }
    kept = []
    for m in history:
        if m.role == Message.Role.ASSISTANT:
            if m.verdict == REJECTED and room.rejected_left_out:
                continue
            unvoted = m.verdict != APPROVED and not (m.votes_up or m.votes_down)
            if m.reply_to_id in approved_to and unvoted and not m.merge_of:  # a merge is what the room asked for
                continue
        kept.append(m)
    return kept
