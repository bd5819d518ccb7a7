"""The client's actions (docs/wire.md, "Client to server"), each declared once, where it
is implemented, with `@command`: its name, its parameters, who may use it and whether
a locked room refuses it. The consumer parses a frame and hands it to `dispatch`:

    parse_action(text)        one JSON object: (name, fields); pure, no I/O
    dispatch(socket, ...)     the command's parameters parsed and checked (no I/O), then
                              its rate (the shared state: a flood never reaches the
                              database), then the command, which reaches the database
                              through `ctx.store(fn, ...)`: its first call resolves the
                              member, the room and the referenced message (through
                              `visible_to`) and checks them, in the same database call.

So no command checks membership, roles or message ids itself, and a command that needs
no database of its own still gets its `Access` checked (`await ctx.resolve()`) before
it acts (tests/test_commands.py sends every registered command from a member removed
meanwhile and expects `room.forbidden`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from channels.db import database_sync_to_async
from django.conf import settings
from django.db.models import QuerySet

from collab.chat.errors import ClientError
from collab.chat.models import Membership, Message, Room
from collab.chat.prepared import Prepared
from collab.chat.services import moderation, sessions
from collab.chat.services.rooms import check_open

T = TypeVar("T")
Parser = Callable[[object], Any]

_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII digits only: "²".isdigit() is True, and int("²") fails


# --- parameters ------------------------------------------------------------------------------


def message_id(value: object) -> int:
    """A message number, as an int or a string of ASCII digits."""
    if isinstance(value, bool) or not isinstance(value, int | str) or not _DIGITS.fullmatch(str(value)):
        raise ClientError("message.invalid_id", "message_id must be a message number.")
    return int(str(value))


def raw(value: object) -> object:
    """Passed on as sent (None when absent): the command's own service checks it."""
    return value


# --- who acts, on what ---------------------------------------------------------------------------


@dataclass
class Access:
    """The member who sends the action, with their user and room, and the message it
    names (None for an action that names none): resolved once per action."""

    membership: Membership
    message: Message | None
    address: str | None

    @property
    def room(self) -> Room:
        return self.membership.room

    @property
    def actor(self) -> moderation.Actor:
        return moderation.Actor(self.membership.user, self.address)


def _member(room_id: int, user_id: int) -> QuerySet[Membership]:
    return Membership.objects.select_related("user", "room").filter(room_id=room_id, user_id=user_id)[:1]


# Its SQL compiled once (chat/prepared.py): it runs on every action, posts included.
_MEMBER = Prepared(_member, 2)
# What the commands on a reply read of it (its question, its provider, its recipient).
_REPLY_RELATED = ("reply_to", "assistant__provider", "room", "recipient")


@dataclass(frozen=True)
class Ref:
    """What a command's `message_id` names: any message of the room the member can see,
    or only an assistant's reply (`replies`); `noun` is what "no such ..." calls it."""

    replies: bool = False
    noun: str = "message"


MESSAGE, REPLY = Ref(), Ref(replies=True, noun="reply")


def resolve(command: Command, socket: Socket, ref: int | None) -> Access:
    """The checks every action passes before it changes anything (database thread)."""
    found = _MEMBER.rows(socket.room_id, socket.user_id)
    if not found:
        raise ClientError("room.forbidden", "You are not a member of this room.")
    # The account as stored now: deactivated, or its password changed since the socket
    # opened (its session's auth hash; an HMAC of the row just read, no query).
    refusal = sessions.account_refusal(found[0].user, socket.auth_hash)
    if refusal is not None:
        raise ClientError("session.ended", refusal)
    access = Access(found[0], None, socket.address)
    if command.power is not None and not moderation.may(access.actor, access.room, command.power):
        moderation.refuse(command.power)
    if command.message is not None and ref is not None:
        # Another member's personal reply is as if it did not exist.
        rows = Message.objects.filter(pk=ref, room_id=socket.room_id).visible_to(socket.user_id)
        if command.message.replies:
            rows = rows.filter(role=Message.Role.ASSISTANT).select_related(*_REPLY_RELATED)
        access.message = rows.first()
        if access.message is None:
            raise ClientError("message.not_found", f"There is no such {command.message.noun} in this room.")
    if command.open_room:
        check_open(access.room)
    return access


# --- the registry --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    name: str
    run: Callable[..., Awaitable[None]]  # run(ctx, **params)
    params: Mapping[str, Parser] = field(default_factory=dict)
    message: Ref | None = None  # what its `message_id` names: resolved to `ctx.access.message`
    power: moderation.Power | None = None  # a moderator's power it needs (services/moderation.py)
    open_room: bool = False  # refused in a locked or archived room
    rate: Callable[[int, int], Awaitable[None]] | None = None  # rate(user_id, room_id): raises when over


COMMANDS: dict[str, Command] = {}


def command(
    name: str,
    *,
    params: Mapping[str, Parser] | None = None,
    message: Ref | None = None,
    power: moderation.Power | None = None,
    open_room: bool = False,
    rate: Callable[[int, int], Awaitable[None]] | None = None,
) -> Callable[[Callable[..., Awaitable[None]]], Callable[..., Awaitable[None]]]:
    """Declare a client action; `params`: field -> parser (a ClientError for a bad value).
    With `message`, `message_id` is parsed here and resolved to `ctx.access.message`."""

    def register(run: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        if name in COMMANDS:
            raise ValueError(f"the action {name!r} is declared twice")
        fields = dict(params or {})
        if message is not None:
            fields["message_id"] = message_id
        COMMANDS[name] = Command(name, run, fields, message, power, open_room, rate)
        return run

    return register


@dataclass
class Socket:
    """The socket an action comes from (the consumer's)."""

    user_id: int
    room_id: int
    username: str
    channel_name: str
    address: str | None
    tell: Callable[[str], Awaitable[None]]  # HTML to this socket alone
    auth_hash: str | None = None  # its session's auth hash at connect (None: not checked)


class Ctx:
    """One action of one socket: who sends it, and its checked `Access` once resolved."""

    def __init__(self, command: Command, socket: Socket, ref: int | None) -> None:
        self.command = command
        self.socket = socket
        self.user_id, self.room_id = socket.user_id, socket.room_id
        self.access: Access | None = None
        self._ref = ref

    def check(self) -> Access:
        """The action's Access, resolved and checked on first use (database thread)."""
        if self.access is None:
            self.access = resolve(self.command, self.socket, self._ref)
        return self.access

    async def resolve(self) -> Access:
        return await database_sync_to_async(self.check)()

    async def store(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(access, *args) on the database thread, the access resolved first (once)."""

        def run() -> T:
            return fn(self.check(), *args)

        return await database_sync_to_async(run)()

    async def tell(self, html: str) -> None:
        await self.socket.tell(html)


def parse_action(text_data: str | None) -> tuple[str, dict[str, Any]]:
    """(action, fields) of one client frame; `post` when the frame names no action."""
    if not text_data:
        raise ClientError("frame.malformed", "Send JSON text frames.")
    if len(text_data) > settings.COLLAB["MAX_FRAME_BYTES"]:
        raise ClientError("frame.too_large", "That frame is too large.")
    try:
        content = json.loads(text_data)
    except (ValueError, RecursionError):
        raise ClientError("frame.malformed", "That frame is not valid JSON.") from None
    if not isinstance(content, dict):
        raise ClientError("frame.malformed", "A frame is a JSON object.")
    action = content.get("action") or "post"
    if not isinstance(action, str) or action not in COMMANDS:
        raise ClientError("action.unknown", f"Unknown action {str(action)[:40]!r}.")
    return action, content


async def dispatch(socket: Socket, action: str, fields: Mapping[str, Any]) -> None:
    """Run one parsed action: its parameters, its rate, then the command itself."""
    command = COMMANDS[action]
    params = {name: parse(fields.get(name)) for name, parse in command.params.items()}  # absent: None
    if command.rate is not None:
        await command.rate(socket.user_id, socket.room_id)
    ref = params.pop("message_id") if command.message is not None else None
    await command.run(Ctx(command, socket, ref), **params)


async def act(user_id: int, room_id: int, action: str, **fields: Any) -> list[str]:
    """Run an action as member `user_id` would send it over a socket of room `room_id`,
    with every check (tests use it where no socket is needed); what that socket is told."""
    told: list[str] = []

    async def tell(html: str) -> None:
        told.append(html)

    await dispatch(Socket(user_id, room_id, "", "", None, tell), action, fields)
    return told
