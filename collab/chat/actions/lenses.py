"""Personal lenses, and sharing a personal reply (docs/architecture.md#a-personal-replies).

A member's lens ("answer me in Spanish") is theirs in one room (Membership.lens). `/each`
(actions/each.py) makes one reply per member who has one; each is stored with its
recipient and stays theirs alone (frames, snapshot, pages, history sent to models) until
they share it: then it is an ordinary message of the room, shown to everyone at its seq.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from channels.db import database_sync_to_async
from django.template.loader import get_template

from collab.chat import broadcast, rendering, shared
from collab.chat.actions.rooms import check_open
from collab.chat.errors import ClientError
from collab.chat.models import Membership, Message, Room

MAX_LENS_CHARS = 500  # Membership.lens's max_length
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # as actions/posting.py: PostgreSQL refuses NUL
_DIGITS = re.compile(r"[0-9]{1,18}")
_lens = get_template("chat/_lens.html")


# --- the lens -------------------------------------------------------------------------------


def check_lens(text: object) -> str:
    if not isinstance(text, str):
        raise ClientError("lens.invalid", "A lens needs a text field (empty text clears it).")
    text = text.strip()
    if _UNSTORABLE.search(text):
        raise ClientError("lens.invalid", "That lens holds a NUL or a broken character; it was not set.")
    if len(text) > MAX_LENS_CHARS:
        raise ClientError(
            "lens.too_long", f"A lens is at most {MAX_LENS_CHARS} characters; this one has {len(text):,}."
        )
    return text


def _store_lens(user_id: int, room_id: int, text: str) -> None:
    if not Membership.objects.filter(room_id=room_id, user_id=user_id).update(lens=text):
        raise ClientError("room.forbidden", "You are not a member of this room.")


def lens_html(lens: str, oob: bool = False) -> str:
    """The member's lens box (room page, beside the composer); `oob`: as a frame."""
    return _lens.render({"lens": lens, "oob": oob, "max": MAX_LENS_CHARS}).strip()


async def set_lens(user_id: int, room_id: int, text: object) -> None:
    """Set (or, with empty text, clear) the member's lens here; every tab of theirs in
    this room shows it (their member group), nobody else's."""
    lens = check_lens(text)
    await database_sync_to_async(_store_lens)(user_id, room_id, lens)
    await broadcast.to_room(
        room_id, {"type": "room.frame", "kind": "other", "html": lens_html(lens, True), "to": user_id}
    )


def lens_prompt(username: str, lens: str) -> str:
    """What a personal reply's model is told about its one reader (context.build_context)."""
    return (
        f"This reply is for {username} alone: only they will read it. "
        f"Their personal lens, which your answer must follow: {lens}"
    )


def personal_lenses(room: Room, replies: Iterable[Message]) -> dict[int | None, str]:
    """The lens prompt of each personal reply's recipient, by user id (actions.replies)."""
    ids = {r.recipient_id for r in replies if r.recipient_id is not None}
    if not ids:
        return {}
    rows = Membership.objects.filter(room=room, user_id__in=ids).values_list("user_id", "user__username", "lens")
    return {uid: lens_prompt(name, lens) for uid, name, lens in rows if lens}


# --- sharing a personal reply ------------------------------------------------------------------


STREAMING = ("share.streaming", "This reply is still being written: share it once it has ended.")


def _shareable(user_id: int, room_id: int, message_id: object) -> Message:
    """The reply `user_id` asks to share, once every check passed (nothing changed yet)."""
    if isinstance(message_id, bool) or not isinstance(message_id, int | str) or not _DIGITS.fullmatch(str(message_id)):
        raise ClientError("message.invalid_id", "message_id must be a message number.")
    if not Membership.objects.filter(room_id=room_id, user_id=user_id).exists():
        raise ClientError("room.forbidden", "You are not a member of this room.")
    # Another member's personal reply is as if it did not exist (the same answer as none).
    message = (
        Message.objects.filter(pk=int(message_id), room_id=room_id, role=Message.Role.ASSISTANT)
        .visible_to(user_id)
        .first()
    )
    if message is None:
        raise ClientError("message.not_found", "There is no such reply in this room.")
    if message.recipient_id is None:
        raise ClientError("share.not_personal", "This reply is already shared with the room.")
    if message.status == Message.Status.STREAMING:
        raise ClientError(*STREAMING)
    check_open(message.room)  # sharing publishes: not in a locked or archived room
    return message


def _store_share(user_id: int, message: Message) -> None:
    done = Message.objects.filter(pk=message.pk, recipient_id=user_id).exclude(status=Message.Status.STREAMING)
    if not done.update(recipient=None):  # shared meanwhile (another tab of theirs)
        raise ClientError("share.not_personal", "This reply is already shared with the room.")
    message.recipient = None


async def share(user_id: int, room_id: int, message_id: object) -> None:
    """The recipient shares their finished personal reply: from now on it is the room's,
    and every member's page shows it at its seq (collab.js places articles by seq; the
    recipient's own copy is replaced in place).

    A reply whose outcome is stored but whose final article may not have been sent yet
    still holds its live record (actions.sink.RoomSink.finish ends it after the
    final): refused as still streaming, so that no late `final` marks it personal again."""
    message = await database_sync_to_async(_shareable)(user_id, room_id, message_id)
    if await shared.backend().leased([message.pk]):
        raise ClientError(*STREAMING)
    await database_sync_to_async(_store_share)(user_id, message)
    await broadcast.to_room(room_id, {"type": "room.frame", "kind": "other", "html": rendering.frame_new([message])})
