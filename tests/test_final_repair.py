"""No page left wrong (issue 33): a final frame lost on its way (here: dropped on purpose
on its way to the channel layer) reaches the sockets that still expect it within two
heartbeats (lifecycle.Runtime.beat -> repair.py), without a reconnect; a reply still
streaming is never finalled early."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async

from collab.chat import broadcast
from collab.chat.generation import registry
from collab.chat.lifecycle import runtime
from collab.chat.models import Message
from tests.conftest import World, member, reply_ids, stalling

pytestmark = pytest.mark.usefixtures("replies_idle", "memory_layer")


async def test_a_lost_final_is_sent_again_within_two_beats(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    sent = broadcast.to_room
    dropped: list[int] = []

    async def lossy(room_id: int, frame: Any) -> None:
        if frame["kind"] == "final" and not dropped:  # the first final: lost, as in a hiccup
            dropped.append(frame["msg"])
            return
        await sent(room_id, frame)

    monkeypatch.setattr(broadcast, "to_room", lossy)
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.post("@a tell me something short")
        await alice.until(lambda f: bool(reply_ids(f)))
        (reply_id,) = reply_ids(alice.frames)

        owner = registry.get(reply_id)
        assert owner is not None and owner.task is not None
        await owner.task  # stored, and its final dropped on the way
        assert dropped == [reply_id]
        stored = await database_sync_to_async(Message.objects.get)(pk=reply_id)
        for m in (alice, bob):  # every piece arrived; the final did not
            await m.until(lambda f: reply_id in f.replies and f.replies[reply_id].text == stored.text)
            assert not m.frames.replies[reply_id].final_attrs
        await runtime.beat()  # a suspect: not yet
        await alice.assert_silent()
        await runtime.beat()  # still ended, still expected: its stored article, to both
        for m in (alice, bob):
            await m.until(lambda f: bool(f.replies[reply_id].final_attrs))
        assert 'data-status="done"' in alice.raw[-1] and stored.text
        await runtime.beat()  # nothing more: it is off their floors
        await alice.assert_silent()


async def test_a_reply_still_streaming_is_left_alone(world: World) -> None:
    await stalling(world, "a")
    async with member(world.alice) as alice:
        await alice.post("@a keep going")
        await alice.until(lambda f: any(r.pieces for r in f.replies.values() if r.role == "assistant"))
        for _ in range(3):
            await runtime.beat()
        (reply_id,) = reply_ids(alice.frames)
        assert not alice.frames.replies[reply_id].final_attrs
        await alice.send(action="stop", message_id=reply_id)  # ended now, by its asker
        await alice.until(lambda f: bool(f.replies[reply_id].final_attrs))
