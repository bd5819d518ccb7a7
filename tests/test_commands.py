"""The command registry (collab/chat/commands/registry.py): every client action is
declared once, and every one is checked before it acts: a member removed while their
socket stayed open (the layer away when they were kicked) is refused by each, with
nothing stored; a message of another room, or another member's personal reply, is not
found; docs/wire.md names every one."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async

from collab.chat.commands import COMMANDS, parse_action
from collab.chat.commands.registry import act
from collab.chat.errors import ClientError
from collab.chat.models import AuditEntry, Membership, Message, Room
from collab.chat.services.rooms import allocate_seqs
from tests.conftest import World

ROOT = Path(__file__).resolve().parent.parent

# A well-formed frame of each action, for a question (q) and an assistant's reply to it (r).
SAMPLES: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "post": lambda q, r: {"text": "hello"},
    "stop": lambda q, r: {"message_id": r},
    "regenerate": lambda q, r: {"message_id": r},
    "show_version": lambda q, r: {"message_id": r, "version": 1},
    "continue": lambda q, r: {"message_id": r},
    "steer": lambda q, r: {"message_id": r, "text": "shorter, and in French"},
    "merge": lambda q, r: {"message_id": q},
    "vote": lambda q, r: {"message_id": r, "value": "up"},
    "edit": lambda q, r: {"message_id": q, "text": "changed"},
    "delete": lambda q, r: {"message_id": q},
    "lens": lambda q, r: {"text": "in French"},
    "share": lambda q, r: {"message_id": r},
    "typing": lambda q, r: {},
    "pin": lambda q, r: {"message_id": q},
    "unpin": lambda q, r: {"message_id": q},
    "react": lambda q, r: {"message_id": r, "emoji": "👍"},
    "kick": lambda q, r: {"username": "alice"},
    "ban": lambda q, r: {"username": "alice", "reason": "x"},
    "unban": lambda q, r: {"username": "alice"},
    "lock": lambda q, r: {},
    "unlock": lambda q, r: {},
    "stop_all": lambda q, r: {},
    "read": lambda q, r: {"seq": 1},
    "notify": lambda q, r: {"level": "all"},
}


def conversation(world: World, recipient: Any = None) -> tuple[int, int]:
    """A question of bob's and an assistant's finished reply to it."""
    seq = allocate_seqs(world.room.pk, 2)
    q = Message.objects.create(room=world.room, seq=seq, role="user", author=world.bob, author_name="bob", text="q?")
    r = Message.objects.create(
        room=world.room,
        seq=seq + 1,
        role="assistant",
        assistant=world.assistants["a"],
        author_name="A",
        reply_to=q,
        text="an answer",
        recipient=recipient,
    )
    return q.pk, r.pk


def test_every_action_is_sampled_here_and_named_in_the_wire_contract() -> None:
    assert set(SAMPLES) == set(COMMANDS)  # a new command: add its sample above
    wire = (ROOT / "docs" / "wire.md").read_text()
    for name in COMMANDS:
        assert name == "post" or re.search(rf'"action": "{name}"|"{name}"', wire), f"{name} is not in docs/wire.md"


def stored() -> tuple[list[Any], int]:
    rows = Message.objects.order_by("pk").values_list("pk", "text", "status", "pinned_at", "recipient_id", "deleted_at")
    return list(rows), AuditEntry.objects.count()


@pytest.mark.parametrize("action", sorted(SAMPLES))
async def test_a_member_removed_meanwhile_is_refused_by_every_action(world: World, action: str) -> None:
    q, r = await database_sync_to_async(conversation)(world)
    await database_sync_to_async(Membership.objects.filter(room=world.room, user=world.bob).delete)()
    before = await database_sync_to_async(stored)()
    with pytest.raises(ClientError) as refused:
        await act(world.bob.pk, world.room.pk, action, **SAMPLES[action](q, r))
    assert refused.value.code == "room.forbidden"
    assert await database_sync_to_async(stored)() == before


@pytest.mark.parametrize("action", sorted(name for name, c in COMMANDS.items() if c.message is not None))
async def test_every_action_on_a_message_finds_none_elsewhere(world: World, action: str) -> None:
    """Another room's message, and another member's personal reply, are as if they did
    not exist (carol owns the other room, so every role check would pass)."""
    q, r = await database_sync_to_async(conversation)(world)
    _, personal = await database_sync_to_async(conversation)(world, recipient=world.bob)

    def other_room() -> int:
        room = Room.objects.create(name="Other", slug="other", owner=world.carol)
        Membership.objects.create(room=room, user=world.carol, role=Membership.Role.OWNER)
        return room.pk

    other = await database_sync_to_async(other_room)()
    before = await database_sync_to_async(stored)()
    fields = SAMPLES[action](q, r)
    with pytest.raises(ClientError) as elsewhere:
        await act(world.carol.pk, other, action, **fields)
    assert elsewhere.value.code == "message.not_found"
    with pytest.raises(ClientError) as not_hers:
        await act(world.alice.pk, world.room.pk, action, **{**fields, "message_id": personal})
    assert not_hers.value.code == "message.not_found"
    with pytest.raises(ClientError) as forged:
        await act(world.alice.pk, world.room.pk, action, **{**fields, "message_id": "7; DROP TABLE"})
    assert forged.value.code == "message.invalid_id"
    assert await database_sync_to_async(stored)() == before


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ('{"action": "drop_tables"}', "action.unknown"),
        ('{"action": ["post"]}', "action.unknown"),
        ('{"action": "Post"}', "action.unknown"),
        ("[]", "frame.malformed"),
        ("{", "frame.malformed"),
        ("", "frame.malformed"),
    ],
)
def test_an_unknown_or_malformed_action_keeps_its_code(frame: str, code: str) -> None:
    with pytest.raises(ClientError) as refused:
        parse_action(frame)
    assert refused.value.code == code
