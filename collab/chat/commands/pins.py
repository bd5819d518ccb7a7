"""`pin` and `unpin` (docs/wire.md, "pin"): a member pins a message of the room to its
pinned list, shown to every member beside the chat (a room panel), live on every process,
in every snapshot and in the exports (services/transcripts.py). The member who pinned a
message unpins it; so may a moderator or the room's owner, anyone's pin.

Only a message everyone sees can be pinned (never a personal reply), not a deleted one,
and at most MAX_PINS per room; a locked or archived room refuses both.
"""

from __future__ import annotations

from django.db import transaction
from django.template.loader import render_to_string
from django.utils import timezone

from collab.chat import broadcast, frames
from collab.chat.commands.registry import MESSAGE, Access, Ctx, command
from collab.chat.errors import ClientError
from collab.chat.models import Message
from collab.chat.services.panels import panel

MAX_PINS = 50  # the pinned list is in every snapshot: bounded


@panel
def pinned_list(room_id: int, user_id: int | None, oob: bool) -> str:
    """The room's pinned messages, newest pin first (the same for every member: personal
    replies are never pinned)."""
    pins = (
        Message.objects.filter(room_id=room_id, pinned_at__isnull=False, deleted_at__isnull=True)
        .shared()
        .order_by("-pinned_at")
        .only("id", "seq", "author_name", "text", "pinned_by_name")[:MAX_PINS]
    )
    return render_to_string("chat/_pins.html", {"pins": list(pins), "oob": oob}).strip()


def _locked(access: Access) -> Message:
    assert access.message is not None
    message = Message.objects.select_for_update().get(pk=access.message.pk)
    if message.deleted_at is not None:
        raise ClientError("message.deleted", "This message was deleted.")
    return message


def _store_pin(access: Access) -> Message:
    with transaction.atomic():
        message = _locked(access)
        if message.recipient_id is not None:
            raise ClientError("pin.personal", "A personal reply cannot be pinned: share it with the room first.")
        if message.pinned_at is not None:
            raise ClientError("pin.already", f"This message is already pinned (by {message.pinned_by_name}).")
        pinned = Message.objects.filter(room_id=access.room.pk, pinned_at__isnull=False, deleted_at__isnull=True)
        if pinned.count() >= MAX_PINS:
            raise ClientError("pin.too_many", f"A room has at most {MAX_PINS} pinned messages: unpin one first.")
        user = access.membership.user
        message.pinned_at, message.pinned_by, message.pinned_by_name = timezone.now(), user, user.get_username()
        message.save(update_fields=["pinned_at", "pinned_by", "pinned_by_name"])
        return message


def _store_unpin(access: Access) -> Message:
    with transaction.atomic():
        message = _locked(access)
        if message.pinned_at is None:
            raise ClientError("pin.not_pinned", "This message is not pinned.")
        if message.pinned_by_id != access.membership.user_id and not access.membership.moderates:
            raise ClientError(
                "pin.forbidden", "Only the member who pinned it, a moderator or the room's owner can unpin it."
            )
        message.pinned_at, message.pinned_by, message.pinned_by_name = None, None, ""
        message.save(update_fields=["pinned_at", "pinned_by", "pinned_by_name"])
        return message


def _frame(access: Access, message: Message) -> str:
    """The message's pin button and the room's pinned list, as they now are."""
    button = render_to_string("chat/_pin_button.html", {"m": message, "oob": True}).strip()
    return button + pinned_list(access.room.pk, None, True)


@command("pin", message=MESSAGE, open_room=True)
async def pin(ctx: Ctx) -> None:
    message = await ctx.store(_store_pin)
    await broadcast.to_room(ctx.room_id, frames.other(await ctx.store(_frame, message)))


@command("unpin", message=MESSAGE, open_room=True)
async def unpin(ctx: Ctx) -> None:
    message = await ctx.store(_store_unpin)
    await broadcast.to_room(ctx.room_id, frames.other(await ctx.store(_frame, message)))
