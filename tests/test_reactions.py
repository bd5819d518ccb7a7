"""Reactions (docs/wire.md, "react"): over real sockets (the consumer in-process), a
reaction reaches every member as the message's bar, is in the next snapshot and in both
exports; forged and bad frames are refused with nothing changed; a personal reply's
reactions stay its recipient's. Across two real Daphne processes:
tests/test_reactions_cluster.py."""

from __future__ import annotations

import json
import re
from typing import Any

import emoji as emoji_lib
from channels.db import database_sync_to_async
from django.db import connection
from django.test.utils import CaptureQueriesContext

from collab.chat import emojis, reactionbar
from collab.chat.commands import reactions
from collab.chat.models import Membership, Message, Reaction, Room
from collab.chat.services import snapshot
from tests.conftest import Member, World, member
from tests.test_history import exported
from tests.test_pins import put, refused

BAR = re.compile(r'<div id="msg-(\d+)-reactions"[^>]*>.*?</div>', re.S)
BUTTON = re.compile(r'data-emoji="([^"]+)" data-by="([^"]*)".*?<span class="n">(\d+)</span>', re.S)


def bars(raw: list[str], message_id: int) -> list[str]:
    """Every reaction bar of message `message_id` this socket was sent, in order."""
    return [m.group(0) for frame in raw for m in BAR.finditer(frame) if int(m.group(1)) == message_id]


def counts(raw: list[str], message_id: int) -> dict[str, tuple[int, str]] | None:
    """The last bar's {emoji: (count, who)}; None if it was never sent."""
    seen = bars(raw, message_id)
    if not seen:
        return None
    return {e: (int(n), by) for e, by, n in BUTTON.findall(seen[-1])}


async def reacted(m: Member, message_id: int, want: dict[str, tuple[int, str]]) -> None:
    await m.until(lambda f: counts(m.raw, message_id) == want)


def test_the_quick_set_and_the_picker_come_from_the_library() -> None:
    for q in emojis.QUICK:
        assert emoji_lib.EMOJI_DATA[q]["status"] == emoji_lib.STATUS["fully_qualified"], q
    assert emojis.canonical("❤") == "❤️"  # unqualified: the same reaction as the qualified form
    assert emojis.canonical("👍🏽") == "👍🏽"  # a skin tone is accepted
    assert emojis.canonical("🏽") is None  # a component alone is not
    assert emojis.canonical("👍👍") is None and emojis.canonical(":thumbs_up:") is None and emojis.canonical(7) is None
    body = json.loads(emojis.catalogue_json())
    names = {row[1]: row[0] for row in body["emoji"]}
    assert names["rocket"] == "🚀" and names["thumbs up"] == "👍"
    assert len(body["emoji"]) > 1500 and [r[0] for r in body["emoji"][: len(emojis.QUICK)]] == list(emojis.QUICK)


async def test_a_reaction_reaches_every_member_the_snapshot_and_the_exports(world: World) -> None:
    question = await database_sync_to_async(put)(world.room, "bob", "ship it on friday?")
    async with member(world.alice) as alice, member(world.bob) as bob:
        assert counts(alice.raw, question.pk) == {}  # the snapshot holds its (empty) bar
        await bob.send(action="react", message_id=question.pk, emoji="👍")
        await alice.send(action="react", message_id=question.pk, emoji="👍")
        await alice.send(action="react", message_id=question.pk, emoji="🎉")
        for m in (alice, bob):
            await reacted(m, question.pk, {"👍": (2, "bob alice"), "🎉": (1, "alice")})
        last = bars(alice.raw, question.pk)[-1]
        assert "thumbs up: bob and alice" in last  # who, on hover (the tooltip)
        await bob.send(action="react", message_id=question.pk, emoji="👍")  # a toggle: taken back
        for m in (alice, bob):
            await reacted(m, question.pk, {"👍": (1, "alice"), "🎉": (1, "alice")})
        await alice.send(action="react", message_id=question.pk, emoji="🎉", on=True)  # set: already there
        await alice.send(action="react", message_id=question.pk, emoji="🚀", on=False)  # unset: never there
        await alice.send(action="react", message_id=question.pk, emoji="❤")  # stored as ❤️
        await bob.until(lambda f: "❤️" in (counts(bob.raw, question.pk) or {}))
    async with member(world.bob) as again:  # a new page: in its snapshot
        assert counts(again.raw, question.pk) == {"👍": (1, "alice"), "🎉": (1, "alice"), "❤️": (1, "alice")}
    rows = await database_sync_to_async(lambda: set(Reaction.objects.values_list("user_name", "emoji")))()
    assert rows == {("alice", "❤️"), ("alice", "👍"), ("alice", "🎉")}
    _, body, _ = await database_sync_to_async(exported)(world.bob, "/r/lab/export.json")
    (record,) = [r for r in json.loads(body)["messages"] if r["id"] == question.pk]
    assert record["reactions"] == [
        {"emoji": "👍", "name": "thumbs up", "count": 1, "by": ["alice"]},
        {"emoji": "🎉", "name": "party popper", "count": 1, "by": ["alice"]},
        {"emoji": "❤️", "name": "red heart", "count": 1, "by": ["alice"]},
    ]
    _, markdown, _ = await database_sync_to_async(exported)(world.bob, "/r/lab/export.md")
    assert "> reactions: 👍 1 (alice), 🎉 1 (alice), ❤️ 1 (alice)" in markdown.decode()


async def test_forged_and_bad_reactions_are_refused_and_change_nothing(world: World) -> None:
    def setup() -> tuple[Message, Message, Message]:
        shared = put(world.room, "alice", "shared")
        personal = put(world.room, "a", "for bob alone", recipient=world.bob)
        gone = put(world.room, "bob", "", deleted_at=shared.created_at)
        put(world.room, "a", "an earlier version, asked again since", version_hidden=True)
        other = Room.objects.create(name="Other", slug="other", owner=world.carol)
        Membership.objects.create(room=other, user=world.carol, role=Membership.Role.OWNER)
        return shared, personal, gone

    shared, personal, gone = await database_sync_to_async(setup)()
    async with member(world.alice) as alice, member(world.bob) as bob, member(world.carol, "other") as carol:
        await refused(carol, "message.not_found", action="react", message_id=shared.pk, emoji="👍")  # another room's
        await refused(alice, "message.not_found", action="react", message_id=personal.pk, emoji="👍")  # bob's reply
        await refused(bob, "message.deleted", action="react", message_id=gone.pk, emoji="👍")
        hidden = await Message.objects.aget(room=world.room, version_hidden=True)
        await refused(bob, "react.hidden", action="react", message_id=hidden.pk, emoji="👍")
        for bad in ("x", "👍👍", ":thumbs_up:", "🏽", "", None, 3, "👍" * 40):
            await refused(bob, "react.unknown_emoji", action="react", message_id=shared.pk, emoji=bad)
        await refused(bob, "react.invalid", action="react", message_id=shared.pk, emoji="👍", on="yes")
        await refused(bob, "message.invalid_id", action="react", message_id="²", emoji="👍")
        await database_sync_to_async(Membership.objects.filter(room=world.room, user=world.bob).delete)()
        await refused(bob, "room.forbidden", action="react", message_id=shared.pk, emoji="👍")  # removed, socket open
        await database_sync_to_async(Room.objects.filter(pk=world.room.pk).update)(status=Room.Status.LOCKED)
        await refused(alice, "room.locked", action="react", message_id=shared.pk, emoji="👍")
    assert await database_sync_to_async(Reaction.objects.count)() == 0
    assert await database_sync_to_async(Message.objects.exclude(reactions=[]).count)() == 0


async def test_a_personal_replys_reactions_are_its_recipients_alone(world: World) -> None:
    personal = await database_sync_to_async(put)(world.room, "a", "for bob alone", recipient=world.bob)
    shared = await database_sync_to_async(put)(world.room, "alice", "everyone sees this")
    async with member(world.alice) as alice, member(world.bob) as bob:
        assert counts(alice.raw, personal.pk) is None  # not in her snapshot at all
        await bob.send(action="react", message_id=personal.pk, emoji="👀")
        await reacted(bob, personal.pk, {"👀": (1, "bob")})
        await bob.send(action="react", message_id=shared.pk, emoji="✅")  # then a frame both see
        await alice.until(lambda f: counts(alice.raw, shared.pk) == {"✅": (1, "bob")})
        assert counts(alice.raw, personal.pk) is None  # bob's personal bar never reached her
    _, body, _ = await database_sync_to_async(exported)(world.alice, "/r/lab/export.json")
    assert personal.pk not in [r["id"] for r in json.loads(body)["messages"]]


async def test_too_many_different_reactions_and_the_rate(world: World, monkeypatch: Any) -> None:
    shared = await database_sync_to_async(put)(world.room, "alice", "react to me")
    chosen = [r[0] for r in emojis.catalogue()[: reactions.MAX_DISTINCT + 1]]
    monkeypatch.setattr(reactions, "REACT_BURST", 1000.0)
    async with member(world.alice) as alice, member(world.bob) as bob:
        for e in chosen[: reactions.MAX_DISTINCT]:
            await alice.send(action="react", message_id=shared.pk, emoji=e)
        await alice.until(lambda f: len(counts(alice.raw, shared.pk) or {}) == reactions.MAX_DISTINCT)
        await refused(bob, "react.too_many", action="react", message_id=shared.pk, emoji=chosen[-1])
        await bob.send(action="react", message_id=shared.pk, emoji=chosen[0])  # one it has: fine
        await bob.until(lambda f: (counts(bob.raw, shared.pk) or {}).get(chosen[0], (0,))[0] == 2)
        monkeypatch.setattr(reactions, "REACT_BURST", 1.0)
        monkeypatch.setattr(reactions, "REACT_EVERY_S", 3600.0)
        await bob.send(action="react", message_id=shared.pk, emoji=chosen[1])  # the bucket now holds one token at most
        await refused(bob, "rate.limited", action="react", message_id=shared.pk, emoji=chosen[2])


def test_a_snapshot_reads_no_row_per_message(world: World) -> None:
    """The articles of a snapshot render with reactions, avatars and assistants' cards from
    the messages' own rows: as many queries for 30 messages as for 3."""
    for i in range(3):
        m = put(world.room, "bob", f"m{i}")
        Message.objects.filter(pk=m.pk).update(reactions=[{"emoji": "👍", "by": ["alice", "bob"]}])

    def queries() -> int:
        with CaptureQueriesContext(connection) as seen:
            snapshot.history(world.room, None, world.alice.pk)
        return len(seen.captured_queries)

    few = queries()
    for i in range(27):
        Message.objects.create(
            room=world.room,
            seq=1000 + i,
            role="assistant",
            author_name="A",
            assistant=world.assistants["a"],
            assistant_handle="a",
            provider_name="sim",
            model="sim-large",
            text="ok",
            html="<p>ok</p>",
            reactions=[{"emoji": "🎉", "by": ["alice"]}],
        )
    assert queries() == few
    page = snapshot.history(world.room, None, world.alice.pk)
    html = "".join(page.articles)
    assert html.count('class="reaction"') >= 30 and html.count('class="avatar') >= 30
    assert "<dd><code>@a</code></dd>" in html and "<dd>sim</dd>" in html and "sim-large" in html


def test_the_bar_marks_nothing_per_member() -> None:
    """One bar for every member: who reacted is in data-by, never whose page it is."""
    message = Message(id=5, seq=5, reactions=[{"emoji": "👍", "by": ["alice", "bob"]}, {"emoji": "👀", "by": []}])
    html = reactionbar.bar(message, oob=True)
    assert 'data-by="alice bob"' in html and 'aria-pressed="false"' in html and 'hx-swap-oob="true"' in html
    assert "👀" not in html  # an emoji nobody gives any more is not shown
