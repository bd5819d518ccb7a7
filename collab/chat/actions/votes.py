"""Votes on assistants' replies, and what they decide (docs/wire.md, "vote";
docs/architecture.md#a-votes).

    vote   checks (nothing changes when one fails): the value, the id, the member, the
           room open, who may vote here (Room.voters), the reply (an assistant's, in this
           room, visible to the voter: another member's personal reply does not exist);
           then, in one transaction with the reply's row locked, the Vote row (replaced,
           or deleted by "none"), the counts recounted from the Vote rows, the verdict
           and the voters' list; then the reply's vote bar to the room (or, for a
           personal reply, to its recipient's sockets), on every process.

Verdicts: "rejected" when down > up; "approved" when the room's rule passes:
    Room.approval "voters": up > down and up >= 1;
    Room.approval "online": up > half the members online when the vote is counted (at
        each vote, with the room's online list then: the vote "closes" at every count).
A reply still streaming keeps its votes and verdict; they count once it ends (history
never holds a streaming reply, and its final article shows them).
"""

from __future__ import annotations

import re
from typing import TypeVar

from channels.db import database_sync_to_async
from django.db import transaction
from django.template.loader import get_template
from django.utils import timezone

from collab.chat import broadcast, shared
from collab.chat.actions.rooms import check_open
from collab.chat.context import HistoryRow
from collab.chat.errors import ClientError
from collab.chat.events import RoomFrame
from collab.chat.models import Membership, Message, Room, Vote

APPROVED = "approved"
REJECTED = "rejected"
VALUES = ("up", "down", "none")
# Votes per member and room, across every process (a token bucket in the shared state):
# a burst of VOTE_BURST, then one every VOTE_EVERY_S; more: rate.limited, nothing changed.
VOTE_BURST, VOTE_EVERY_S = 10.0, 0.5
_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII digits only (as actions/replies.py)
_bar = get_template("chat/_votes.html")


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
    """The approved, ended, shared replies to one user message, in seq order (merge)."""
    return list(
        Message.objects.filter(reply_to=answered, role=Message.Role.ASSISTANT, verdict=APPROVED)
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


# --- the vote bar --------------------------------------------------------------------------------


def names(message: Message, value: str) -> list[str]:
    return [v["voter"] for v in message.votes_by if v.get("value") == value]


def bar(message: Message, oob: bool = False) -> str:
    """The reply's vote bar (`#msg-N-votes`): counts, the voters' names (title; its
    `data-up-by`/`data-down-by` give the viewer's pressed state by CSS, room.html), the
    verdict and, on a rejected reply, the button that reopens it."""
    up, down = names(message, "up"), names(message, "down")
    who = "; ".join(p for p in (f"up: {', '.join(up)}" if up else "", f"down: {', '.join(down)}" if down else "") if p)
    return _bar.render(
        {"m": message, "up_by": " ".join(up), "down_by": " ".join(down), "who": who or "no votes yet", "oob": oob}
    ).strip()


# --- the action ---------------------------------------------------------------------------------


def _check(user_id: int, room_id: int, message_id: object, value: object) -> tuple[Membership, str]:
    if not isinstance(value, str) or value not in VALUES:
        raise ClientError("vote.invalid", 'value must be "up", "down" or "none".')
    if isinstance(message_id, bool) or not isinstance(message_id, int | str) or not _DIGITS.fullmatch(str(message_id)):
        raise ClientError("message.invalid_id", "message_id must be a message number.")
    membership = Membership.objects.select_related("room", "user").filter(room_id=room_id, user_id=user_id).first()
    if membership is None:
        raise ClientError("room.forbidden", "You are not a member of this room.")
    check_open(membership.room)  # a locked or archived room's verdicts stand as they are
    if membership.room.voters == Room.Voters.MODERATORS and not membership.moderates:
        raise ClientError("vote.forbidden", "In this room only moderators and the owner can vote on replies.")
    return membership, value


def _store(user_id: int, room_id: int, message_id: object, value: object, online: set[int]) -> Message:
    membership, value = _check(user_id, room_id, message_id, value)
    room = membership.room
    with transaction.atomic():
        message = (
            Message.objects.select_for_update()
            .filter(pk=int(str(message_id)), room_id=room_id)
            .visible_to(user_id)  # another member's personal reply: as if it did not exist
            .first()
        )
        if message is None:
            raise ClientError("message.not_found", "There is no such reply in this room.")
        if message.role != Message.Role.ASSISTANT or message.deleted_at is not None:
            raise ClientError("vote.not_reply", "Only an assistant's reply can be voted on.")
        if value == "none":
            Vote.objects.filter(message=message, voter_id=user_id).delete()
        else:
            Vote.objects.update_or_create(
                message=message,
                voter_id=user_id,
                defaults={"value": value, "voter_name": membership.user.get_username(), "at": timezone.now()},
            )
        rows = list(Vote.objects.filter(message=message).order_by("at", "id").values("voter_name", "value", "at"))
        message.votes_up = sum(1 for r in rows if r["value"] == Vote.Value.UP)
        message.votes_down = len(rows) - message.votes_up
        members_online = Membership.objects.filter(room_id=room_id, user_id__in=online).count() if online else 0
        message.verdict = verdict_of(room, message.votes_up, message.votes_down, members_online)
        message.votes_by = [{"voter": r["voter_name"], "value": r["value"], "at": r["at"].isoformat()} for r in rows]
        message.save(update_fields=["votes_up", "votes_down", "verdict", "votes_by"])
    return message


async def vote(user_id: int, room_id: int, message_id: object, value: object) -> None:
    """One member's vote on one reply (docs/wire.md, "vote"); the new counts to everyone
    who sees the reply, on every process."""
    try:  # the cap first: a flood costs a shared-state call per frame, never a database query
        taken = await shared.backend().take(f"vote:{user_id}:{room_id}", VOTE_BURST, VOTE_EVERY_S)
        online = await shared.backend().online(room_id)
    except shared.UNAVAILABLE:
        raise ClientError(
            "server.unavailable", "The server cannot reach its shared state just now; your vote was not counted."
        ) from None
    if not taken:
        raise ClientError("rate.limited", "You are voting too fast; wait a moment.")
    online.add(user_id)
    message = await database_sync_to_async(_store)(user_id, room_id, message_id, value, online)
    frame: RoomFrame = {"type": "room.frame", "kind": "other", "html": bar(message, oob=True)}
    if message.recipient_id is not None:  # a personal reply: its recipient's sockets only
        frame["to"] = message.recipient_id
    await broadcast.to_room(room_id, frame)
