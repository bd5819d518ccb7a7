"""`read` and `notify` (docs/wire.md, "read", "notify"; docs/architecture.md#a-unread): a
member marks a room read up to a seq (never back), and sets when the page notifies them.

`read` is sent by the page when the room is opened and, while it is open and visible, as
messages arrive (at most one a second, static/collab/sidebar.js); the server's bucket
bounds it whatever a client sends. The new count goes to every socket of the member, on
every process and in every room (their sidebars), only when the mark moved.
"""

from __future__ import annotations

import re

from django.template.loader import render_to_string

from collab.chat import broadcast, frames
from collab.chat.commands.registry import Access, Ctx, command
from collab.chat.errors import ClientError
from collab.chat.services import unread
from collab.chat.services.rooms import take_token

# Reads per member and room, across every process: a burst, then one every READ_EVERY_S.
READ_BURST, READ_EVERY_S = 10.0, 0.5
_DIGITS = re.compile(r"[0-9]{1,18}")


def seq(value: object) -> int | None:
    """A seq as an int or a string of ASCII digits; absent: the room's last."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str) or not _DIGITS.fullmatch(str(value)):
        raise ClientError("read.invalid_seq", "seq must be a message number (0 or more).")
    return int(str(value))


async def take_read_token(user_id: int, room_id: int) -> None:
    await take_token(f"read:{user_id}:{room_id}", READ_BURST, READ_EVERY_S, "nothing was marked read.", "marking read")


def _read(access: Access, upto: int | None) -> tuple[bool, unread.RoomUnread]:
    return unread.mark_read(access.membership, upto)


@command("read", params={"seq": seq}, rate=take_read_token)
async def read(ctx: Ctx, seq: int | None) -> None:
    moved, state = await ctx.store(_read, seq)
    if moved:  # every tab of this member, any room, any process: their sidebars and titles
        await broadcast.to_user(ctx.user_id, unread.read_event(state))


def notify_html(level: str, oob: bool) -> str:
    return render_to_string("chat/_notify.html", {"level": level, "oob": oob}).strip()


def _notify(access: Access, level: object) -> str:
    return unread.set_notify(access.membership, level)


async def take_notify_token(user_id: int, room_id: int) -> None:
    # Each change is a write and a frame to every tab: a flood stops at the shared state.
    await take_token(f"notify:{user_id}:{room_id}", 5, 1.0, "the setting was not changed.", "changing notifications")


@command("notify", params={"level": lambda v: v}, rate=take_notify_token)
async def notify(ctx: Ctx, level: object) -> None:
    """This member's notifications in this room: all, mentions or none; every tab of
    theirs in the room gets the form again (their member group)."""
    stored = await ctx.store(_notify, level)
    await broadcast.to_room(ctx.room_id, frames.other(notify_html(stored, True), to=ctx.user_id))
