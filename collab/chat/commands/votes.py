"""`vote` (docs/wire.md, "vote"): a member's vote on one reply, and the new counts to
everyone who sees it, on every process.

Checked first (nothing changes when one fails): the value, the id, the rate, the member,
the reply (in this room and visible to the voter: another member's personal reply does
not exist), the room open, who may vote here (Room.voters). Then, in one transaction
with the reply's row locked: the Vote row (replaced, or deleted by "none"), the counts
recounted from the Vote rows, the verdict (services/votes.py) and the voters' list.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from collab.chat import broadcast, frames, shared, votebar
from collab.chat.commands.registry import Access, Ctx, Ref, command
from collab.chat.errors import ClientError
from collab.chat.models import Membership, Message, Room, Vote
from collab.chat.services.rooms import take_token
from collab.chat.services.votes import verdict_of

VALUES = ("up", "down", "none")
# Votes per member and room, across every process (a token bucket in the shared state):
# a burst of VOTE_BURST, then one every VOTE_EVERY_S; more: rate.limited, nothing changed.
VOTE_BURST, VOTE_EVERY_S = 10.0, 0.5


def value(given: object) -> str:
    if not isinstance(given, str) or given not in VALUES:
        raise ClientError("vote.invalid", 'value must be "up", "down" or "none".')
    return given


async def take_vote_token(user_id: int, room_id: int) -> None:
    """The cap first: a flood costs a shared-state call per frame, never a database query."""
    await take_token(f"vote:{user_id}:{room_id}", VOTE_BURST, VOTE_EVERY_S, "your vote was not counted.", "voting")


def _store(access: Access, value: str, online: set[int]) -> Message:
    membership, room = access.membership, access.room
    if room.voters == Room.Voters.MODERATORS and not membership.moderates:
        raise ClientError("vote.forbidden", "In this room only moderators and the owner can vote on replies.")
    assert access.message is not None
    with transaction.atomic():
        message = Message.objects.select_for_update().get(pk=access.message.pk)
        if message.role != Message.Role.ASSISTANT or message.deleted_at is not None:
            raise ClientError("vote.not_reply", "Only an assistant's reply can be voted on.")
        if value == "none":
            Vote.objects.filter(message=message, voter_id=membership.user_id).delete()
        else:
            Vote.objects.update_or_create(
                message=message,
                voter_id=membership.user_id,
                defaults={"value": value, "voter_name": membership.user.get_username(), "at": timezone.now()},
            )
        rows = list(Vote.objects.filter(message=message).order_by("at", "id").values("voter_name", "value", "at"))
        message.votes_up = sum(1 for r in rows if r["value"] == Vote.Value.UP)
        message.votes_down = len(rows) - message.votes_up
        members_online = Membership.objects.filter(room_id=room.pk, user_id__in=online).count() if online else 0
        message.verdict = verdict_of(room, message.votes_up, message.votes_down, members_online)
        message.votes_by = [{"voter": r["voter_name"], "value": r["value"], "at": r["at"].isoformat()} for r in rows]
        message.save(update_fields=["votes_up", "votes_down", "verdict", "votes_by"])
    return message


# A reply of this room, whatever its role: another member's personal reply does not exist,
# and a person's message is refused as `vote.not_reply` (not as missing).
_VOTED = Ref(noun="reply")


@command("vote", params={"value": value}, message=_VOTED, open_room=True, rate=take_vote_token)
async def vote(ctx: Ctx, value: str) -> None:
    try:
        online = await shared.backend().online(ctx.room_id)
    except shared.UNAVAILABLE:
        raise ClientError(
            "server.unavailable", "The server cannot reach its shared state just now; your vote was not counted."
        ) from None
    online.add(ctx.user_id)
    message = await ctx.store(_store, value, online)
    # A personal reply's bar: its recipient's sockets only.
    await broadcast.to_room(ctx.room_id, frames.other(votebar.bar(message, oob=True), to=message.recipient_id))
