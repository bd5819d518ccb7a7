"""A room's frames reach this process once, through the room's hub (collab/chat/fanout.py),
and from there every socket of the room, in order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.layers import get_channel_layer

from collab.chat import fanout
from collab.chat.events import room_group
from tests.conftest import World, all_final, member, reply_ids


def group_members(room_id: int) -> set[str]:
    """The channels in the room's group (the in-memory layer's own record)."""
    layer: Any = get_channel_layer()
    return set(layer.groups.get(room_group(room_id), {}))


async def until(condition: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        # The layer's state has no event to wait on: polled, bounded.
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


@pytest.mark.usefixtures("memory_layer", "replies_idle")
async def test_one_group_member_per_room_and_process_however_many_sockets(world: World) -> None:
    room = world.room.id
    async with member(world.alice) as alice, member(world.bob) as bob, member(world.alice) as alice2:
        assert fanout.sockets_in(room) == 3
        assert len(group_members(room)) == 1  # the hub's channel, not one per socket
        await bob.post("@a hello")
        for m in (alice, bob, alice2):
            await m.until(lambda f: all_final(f, 1))
        texts = {m.frames.replies[reply_ids(m.frames)[0]].text for m in (alice, bob, alice2)}
        assert len(texts) == 1 and texts != {""}
        assert all(m.frames.replies[reply_ids(m.frames)[0]].lost == 0 for m in (alice, bob, alice2))
    # The room's last socket gone: the hub leaves the group.
    await until(lambda: fanout.sockets_in(room) == 0 and not group_members(room))


@pytest.mark.usefixtures("memory_layer", "replies_idle")
async def test_a_socket_that_fails_a_frame_does_not_cost_the_others_theirs(world: World) -> None:
    # Bob first: alice's snapshot already shows him online, so nothing more is due to her.
    async with member(world.bob) as bob, member(world.alice) as alice:
        hub = fanout._hubs[world.room.id]
        broken = next(s for s in hub.sockets.values() if getattr(s, "user_id", None) == world.alice.id)

        def fail(event: Any, data: bytes) -> None:
            raise RuntimeError("this socket's frame handling broke")

        broken.take_frame = fail  # type: ignore[method-assign]
        await bob.post("@a are you there?")
        await bob.until(lambda f: all_final(f, 1))
        assert bob.frames.replies[reply_ids(bob.frames)[0]].lost == 0
        await alice.assert_silent()  # hers all failed; bob's all came
