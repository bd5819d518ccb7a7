"""collab.web's Inbox, each socket's input queue under Daphne and the Redis pub/sub layer:
asyncio.Queue's get/put_nowait, in order, nothing lost to a cancelled getter, nothing
held while empty (docs/benchmarks/2026-12-06.md#b-issue-38)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels_redis.pubsub import RedisPubSubLoopLayer
from daphne.server import Server

from collab.web import Inbox, slim_queues


async def test_items_come_out_in_order_and_nothing_is_held_when_empty() -> None:
    inbox = Inbox()
    assert inbox  # Daphne's HTTP protocol tests its queue for truth: true even when empty
    assert inbox.empty() and inbox.qsize() == 0
    for i in range(3):
        inbox.put_nowait(i)
    assert inbox.qsize() == 3
    assert [await inbox.get() for _ in range(3)] == [0, 1, 2]
    assert inbox.empty() and inbox._items is None and inbox._waiters is None
    with pytest.raises(asyncio.QueueEmpty):
        inbox.get_nowait()


async def test_a_getter_waits_for_the_next_put() -> None:
    inbox = Inbox()
    getter = asyncio.ensure_future(inbox.get())
    await asyncio.sleep(0)
    assert not getter.done()
    inbox.put_nowait("connect")
    assert await getter == "connect"
    assert inbox._waiters is None


async def test_a_getter_cancelled_after_its_wake_up_loses_nothing() -> None:
    inbox = Inbox()
    getter = asyncio.ensure_future(inbox.get())
    await asyncio.sleep(0)
    inbox.put_nowait("frame")  # wakes the getter, which has not run yet
    getter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await getter
    assert await inbox.get() == "frame"


async def test_a_cancelled_waiting_getter_leaves_no_waiter() -> None:
    inbox = Inbox()
    getter = asyncio.ensure_future(inbox.get())
    await asyncio.sleep(0)
    getter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await getter
    assert not inbox._waiters


async def test_two_getters_each_take_one_item() -> None:
    inbox = Inbox()
    getters = [asyncio.ensure_future(inbox.get()) for _ in range(2)]
    await asyncio.sleep(0)
    inbox.put_nowait("a")
    inbox.put_nowait("b")
    assert sorted(await asyncio.gather(*getters)) == ["a", "b"]


async def test_daphne_and_the_pubsub_layer_make_inboxes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Put back after the test: the patches are the web process's (collab.web.main).
    monkeypatch.setattr(Server, "create_application", Server.create_application)
    monkeypatch.setattr(RedisPubSubLoopLayer, "_subscribe_to_channel", RedisPubSubLoopLayer._subscribe_to_channel)
    slim_queues()

    received: list[Any] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        received.append(await receive())

    class FakeServer:
        application = staticmethod(app)
        connections: dict[object, dict[str, Any]] = {}

        async def handle_reply(self, protocol: object, message: dict[str, Any]) -> None:
            pass

    server, protocol = FakeServer(), object()
    server.connections = {protocol: {}}
    queue = Server.create_application(server, protocol, {"type": "websocket"})  # type: ignore[arg-type]
    assert isinstance(queue, Inbox)
    queue.put_nowait({"type": "websocket.connect"})
    await server.connections[protocol]["application_instance"]
    assert received == [{"type": "websocket.connect"}]

    class Shard:
        async def subscribe(self, channel: str) -> None:
            pass

    layer = RedisPubSubLoopLayer.__new__(RedisPubSubLoopLayer)
    layer.channels = {}
    layer._get_shard = lambda channel: Shard()  # type: ignore[method-assign]
    await layer._subscribe_to_channel("specific.x")
    assert isinstance(layer.channels["specific.x"], Inbox)
