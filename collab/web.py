"""The web process: Daphne on uvloop.

`python -m collab.web -b HOST -p PORT collab.asgi:application` takes Daphne's own
command line (`python -m daphne --help`). Daphne makes its Twisted reactor's asyncio
loop with `asyncio.new_event_loop()` when `daphne.server` is first imported, so the
loop policy set here, before that import, decides which loop it is; Twisted's
`AsyncioSelectorReactor` runs on uvloop's, which spends less CPU per delivered frame
than the standard loop (docs/benchmarks/2026-12-03.md#b-faster-parts). `python -m
daphne` still works, on the standard loop.

It also makes Twisted write each frame to its socket at once when nothing is queued
for that socket (`EagerServer`): Twisted queues every write and registers the socket
for writability, then writes and unregisters it on the next loop turn, two epoll
calls and a reactor callback per frame per member
(docs/benchmarks/2026-12-03.md#b-writing-at-once).

And each socket's two input queues, Daphne's (what the client sends) and the Redis
pub/sub layer's (what reaches its channel), are an `Inbox` rather than an
`asyncio.Queue`: an idle socket holds both for its whole life, and a Queue is three
deques of 0.6 KB each, made whether or not anything is queued (docs/benchmarks/2026-12-06.md#b-issue-38).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from twisted.internet.tcp import Server


def use_uvloop() -> bool:
    """Make uvloop the loop of every loop created from here on; False where it is not
    installed (it does not build on Windows): the standard loop then, as before."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def eager_server() -> type[Server]:
    """Twisted's TCP server connection, writing at once when its queue is empty.

    What the socket does not take now (a slow reader's full buffer) is queued as
    before, and every later write queues behind it until it drains: the bytes keep
    their order, and Twisted's flow control and close handling stay as they were.
    """
    from twisted.internet import tcp

    class EagerServer(tcp.Server):
        def write(self, data: Any) -> None:
            if (
                type(data) is bytes
                and data
                and self.connected
                and not (self.disconnecting or self._writeDisconnected or self._aborting or self.TLS)
                and (self.producer is None or self.streamingProducer)  # a pull producer resumes from doWrite
                and not self._tempDataLen
                and self.offset == len(self.dataBuffer)
            ):
                sent = self.writeSomeData(data)
                if isinstance(sent, int):  # else the connection is lost: the queued write finds it out
                    if sent == len(data):
                        return
                    data = data[sent:]
            super().write(data)

    return EagerServer


def write_eagerly() -> None:
    """Every TCP port opened from here on hands its connections to `eager_server()`."""
    from twisted.internet import tcp

    tcp.Port.transport = eager_server()


def close_with_reason() -> None:
    """Send the ASGI `websocket.close` message's `reason` in the close frame: Daphne
    (4.2) drops it, and a 4429's reason is its retry hint (docs/wire.md, 4429)."""
    from daphne.ws_protocol import WebSocketProtocol

    reply = WebSocketProtocol.handle_reply

    def handle_reply(self: WebSocketProtocol, message: dict[str, Any]) -> None:
        if message.get("type") == "websocket.close" and message.get("reason") and self.state != self.STATE_CONNECTING:
            self.sendClose(code=message.get("code") or 1000, reason=str(message["reason"]))
            return
        reply(self, message)

    WebSocketProtocol.handle_reply = handle_reply  # type: ignore[method-assign]


class Inbox:
    """What Daphne and channels_redis's pub/sub layer ask of their `asyncio.Queue`:
    `put_nowait` and `get`, unbounded. An item stays queued until a `get` returns it
    (a getter cancelled after being woken loses nothing); every waiting getter is woken
    by a put and those that find nothing wait again. Nothing is held while empty. No
    `__len__`: Daphne's HTTP protocol tests its queue for truth, as a Queue always is."""

    __slots__ = ("_items", "_waiters")

    def __init__(self) -> None:
        self._items: deque[Any] | None = None
        self._waiters: list[asyncio.Future[None]] | None = None

    def qsize(self) -> int:
        return len(self._items) if self._items is not None else 0

    def empty(self) -> bool:
        return self._items is None

    def put_nowait(self, item: Any) -> None:
        if self._items is None:
            self._items = deque()
        self._items.append(item)
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def get_nowait(self) -> Any:
        items = self._items
        if items is None:
            raise asyncio.QueueEmpty
        item = items.popleft()
        if not items:
            self._items = None
        return item

    async def get(self) -> Any:
        while self._items is None:
            waiter = asyncio.get_running_loop().create_future()
            if self._waiters is None:
                self._waiters = []
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if self._waiters is not None and waiter in self._waiters:
                    self._waiters.remove(waiter)
        return self.get_nowait()


def slim_queues() -> None:
    """Daphne's application queue and the pub/sub layer's channel queues are `Inbox`es.
    Daphne's `create_application` is 4.2's, but for the queue; channels_redis's
    `_subscribe_to_channel` is 4.3's, but for the queue."""
    from functools import partial

    from daphne.server import Server

    def create_application(self: Server, protocol: Any, scope: dict[str, Any]) -> Inbox | None:
        assert "application_instance" not in self.connections[protocol]
        input_queue = Inbox()
        scope.setdefault("asgi", {"version": "3.0"})
        application_instance = self.application(
            scope=scope, receive=input_queue.get, send=partial(self.handle_reply, protocol)
        )
        if protocol not in self.connections:
            return None
        self.connections[protocol]["application_instance"] = asyncio.ensure_future(
            application_instance, loop=asyncio.get_event_loop()
        )
        return input_queue

    Server.create_application = create_application  # type: ignore[method-assign]
    try:
        from channels_redis.pubsub import RedisPubSubLoopLayer
    except ImportError:  # no Redis layer installed: nothing to slim
        return

    async def _subscribe_to_channel(self: RedisPubSubLoopLayer, channel: str) -> None:
        self.channels[channel] = Inbox()
        await self._get_shard(channel).subscribe(channel)

    RedisPubSubLoopLayer._subscribe_to_channel = _subscribe_to_channel  # type: ignore[method-assign]


def main() -> None:
    use_uvloop()
    from daphne.cli import CommandLineInterface  # imports daphne.server: after the policy

    write_eagerly()  # after daphne.server installed its reactor
    close_with_reason()
    slim_queues()
    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
