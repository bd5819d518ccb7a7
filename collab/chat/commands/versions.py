"""`show_version` (docs/wire.md, "show a version"): a reply asked again keeps its versions
in one place (docs/architecture.md#a-versions), and any member who sees it chooses which
one the room shows; every page that shows the slot gets that version's article in its
place (a personal reply's: its recipient's pages only).

Checked first (nothing changes when one fails): the version number, the id, the rate (as
votes'), the member, the reply (in this room and visible to them: another member's
personal reply does not exist), the room open. Then, in one transaction with the slot's
first version locked (as a regeneration locks it): the version asked for, ended, and the
slot's `version_hidden` flags. The history the next replies are sent holds the version
shown (replies/jobs.py).
"""

from __future__ import annotations

import re

from django.db import transaction
from django.db.models import Case, Value, When

from collab.chat import broadcast, frames, slots
from collab.chat.commands.registry import REPLY, Access, Ctx, command
from collab.chat.commands.votes import VOTE_BURST, VOTE_EVERY_S
from collab.chat.errors import ClientError
from collab.chat.models import Message
from collab.chat.services.rooms import take_token

_NUMBER = re.compile(r"[0-9]{1,5}")  # ASCII digits only, as registry.message_id's


def version_number(given: object) -> int | None:
    """A version's number (1 is the first), as an int or a string of ASCII digits; None
    when absent (the version is `message_id` itself)."""
    if given is None:
        return None
    digits = _NUMBER.fullmatch(str(given)) if isinstance(given, int | str) and not isinstance(given, bool) else None
    if digits is None or int(digits.group()) < 1:
        raise ClientError("version.invalid", "version must be a version number (1, 2, ...).")
    return int(digits.group())


async def take_version_token(user_id: int, room_id: int) -> None:
    """A burst, then one every half second, per member and room, across every process (as votes)."""
    await take_token(
        f"version:{user_id}:{room_id}", VOTE_BURST, VOTE_EVERY_S, "no other version is shown.", "switching versions"
    )


def _store(access: Access, number: int | None) -> Message | None:
    """The version now shown, as stored (its question and recipient loaded for its article);
    None when it was shown already (nothing changes, nothing is sent)."""
    asked = access.message
    assert asked is not None
    with transaction.atomic():
        root = Message.objects.select_for_update().only("id", "versions").get(pk=slots.slot_id(asked))
        if root.versions < 2:
            raise ClientError("version.none", "This reply has no other version: Regenerate makes one.")
        chosen = slots.slot_of(root.pk).select_related("reply_to", "recipient")
        chosen = chosen.filter(version=number) if number is not None else chosen.filter(pk=asked.pk)
        version = chosen.first()
        if version is None:
            raise ClientError("version.not_found", f"This reply has {root.versions} versions; there is no {number}.")
        if version.status == Message.Status.STREAMING:
            raise ClientError("reply.streaming", "That version is still being written: show it once it has ended.")
        if not version.version_hidden:
            return None
        hidden = Case(When(pk=version.pk, then=Value(False)), default=Value(True))
        slots.slot_of(root.pk).update(version_hidden=hidden)
        version.version_hidden = False
        return version


@command("show_version", params={"version": version_number}, message=REPLY, open_room=True, rate=take_version_token)
async def show_version(ctx: Ctx, version: int | None) -> None:
    """Show version `version` of the slot of reply `message_id` (absent: that reply itself)."""
    shown = await ctx.store(_store, version)
    if shown is not None:
        await broadcast.to_room(ctx.room_id, frames.other(slots.in_place(shown), to=shown.recipient_id))
