"""`react` (docs/wire.md, "react"): a member's emoji reaction on a message, toggled (or set
with `"on": true|false`), and the message's new reaction bar to everyone who sees it, on
every process, after the commit.

Checked first, nothing changed when one fails: the emoji (one emoji of the Unicode set, as
the `emoji` package knows it: collab/chat/emojis.py), `on`, the id, the rate, the member,
the message (in this room and visible to them: another member's personal reply does not
exist), the room open. Then, in one transaction with the message's row locked: not
deleted, at most MAX_DISTINCT different emoji on it, the Reaction row added or removed, and
`Message.reactions` recounted from the rows (what every page, snapshot and export shows,
so that none of them reads the rows).

A member removed from the room keeps their reactions (like their messages and votes): the
names stay as written. A reply may be reacted to while it streams: its final article
reads the reactions given meanwhile (replies/sink.py).
"""

from __future__ import annotations

from django.db import transaction

from collab.chat import broadcast, emojis, frames, reactionbar
from collab.chat.commands.registry import MESSAGE, Access, Ctx, command
from collab.chat.errors import ClientError
from collab.chat.models import Message, Reaction
from collab.chat.services.rooms import take_token

MAX_DISTINCT = 20  # different emoji on one message: its bar stays one line or two
# Reactions per member and room, across every process (a token bucket in the shared state):
# a burst of REACT_BURST, then one every REACT_EVERY_S; more: rate.limited, nothing changed.
REACT_BURST, REACT_EVERY_S = 20.0, 0.25


def emoji(given: object) -> str:
    found = emojis.canonical(given)
    if found is None:
        shown = repr(given)[:40] if isinstance(given, str) else "nothing"
        raise ClientError(
            "react.unknown_emoji", f"Not an emoji: {shown}. React with one emoji of the Unicode set (the picker's)."
        )
    return found


def on(given: object) -> bool | None:
    """None (absent): toggle; true: add (kept if there); false: remove (nothing if absent)."""
    if given is None or isinstance(given, bool):
        return given
    raise ClientError("react.invalid", '"on" is true, false, or left out (to toggle).')


async def take_react_token(user_id: int, room_id: int) -> None:
    """The cap first: a flood costs a shared-state call per frame, never a database query."""
    await take_token(
        f"react:{user_id}:{room_id}", REACT_BURST, REACT_EVERY_S, "your reaction was not recorded.", "reacting"
    )


def summary(message: Message) -> list[dict[str, object]]:
    """The message's reactions from its rows: each emoji in the order it was first given,
    with who gave it, in the order they did."""
    out: dict[str, list[str]] = {}
    for e, name in Reaction.objects.filter(message=message).order_by("at", "id").values_list("emoji", "user_name"):
        out.setdefault(e, []).append(name)
    return [{"emoji": e, "by": names} for e, names in out.items()]


def _store(access: Access, emoji: str, on: bool | None) -> Message:
    assert access.message is not None
    user = access.membership.user
    with transaction.atomic():
        message = Message.objects.select_for_update().get(pk=access.message.pk)
        if message.deleted_at is not None:
            raise ClientError("message.deleted", "This message was deleted.")
        if message.version_hidden:  # its slot shows another version: no page has its bar
            raise ClientError(
                "react.hidden", "That version of the reply is not shown: react to the one the room shows."
            )
        mine = Reaction.objects.filter(message=message, user=user, emoji=emoji)
        had = mine.exists()
        if on is None:
            on = not had
        if on == had:
            return message  # already as asked: nothing to change, the bar is sent again all the same
        if on:
            given = {str(r["emoji"]) for r in message.reactions}
            if emoji not in given and len(given) >= MAX_DISTINCT:
                raise ClientError(
                    "react.too_many",
                    f"A message has at most {MAX_DISTINCT} different reactions: add one of those it has.",
                )
            Reaction.objects.create(message=message, user=user, user_name=user.get_username(), emoji=emoji)
        else:
            mine.delete()
        message.reactions = summary(message)
        message.save(update_fields=["reactions"])
    return message


@command("react", params={"emoji": emoji, "on": on}, message=MESSAGE, open_room=True, rate=take_react_token)
async def react(ctx: Ctx, emoji: str, on: bool | None) -> None:
    message = await ctx.store(_store, emoji, on)
    # A personal reply's bar: its recipient's sockets only (nobody else has its article).
    await broadcast.to_room(ctx.room_id, frames.other(reactionbar.bar(message, oob=True), to=message.recipient_id))
