"""One socket's outbound frames, bounded (docs/architecture.md#a-slow-clients).

Frames go straight to the socket while its connection keeps up. When the connection's
send buffer fills (the client reads slower than the room streams), Twisted pauses the
socket's producer (this outbox) and frames wait here, in order, up to MAX_FRAMES and
MAX_BYTES; past that the socket is closed with 4408 and its page reconnects and resumes
from its snapshot. Nothing here waits for a client: one slow member never holds up the
room, and its backlog costs the server at most the bound.

The pause/resume signals are Twisted's producer interface (IConsumer.registerProducer on
the socket's TCP connection, under Daphne). Under another server (or the test
communicator) there is no such signal and frames are simply sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from django.conf import settings

from collab.chat import metrics, wsbytes

log = logging.getLogger(__name__)

FLUSH_S = 2.0  # how long a closing socket's queued frames may take to go out
CLOSE_TOO_SLOW = 4408  # docs/wire.md: the socket fell too far behind; the page reconnects


class Outbox:
    # One per socket, for its life: no instance dict (docs/benchmarks/2026-12-06.md#b-issue-38).
    __slots__ = (
        "_as_built", "_bytes", "_closing", "_max_frame", "_on_overflow", "_protocol", "_queue", "_send",
        "_task", "_wake", "max_bytes", "max_frames", "overflowed", "paused",
    )  # fmt: skip

    def __init__(
        self, send: Callable[[str], Awaitable[None]], on_overflow: Callable[[], Coroutine[Any, Any, None]]
    ) -> None:
        self._send = send
        self._on_overflow = on_overflow
        # Made when first needed (a socket that keeps up never queues, nor waits to resume):
        # an empty deque is 0.6 KB, and an Event holds one (docs/architecture.md#a-connects).
        self._queue: deque[str] | None = None
        self._bytes = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing: asyncio.Task[None] | None = None
        self.paused = False
        self.overflowed = False
        self.max_frames = int(settings.COLLAB["SOCKET_BACKLOG_FRAMES"])
        self.max_bytes = int(settings.COLLAB["SOCKET_BACKLOG_BYTES"])
        self._protocol: Any | None = None  # Daphne's WebSocket protocol, written to directly
        self._as_built = False  # a room's frame bytes (wsbytes.py) are what this socket's frames are
        self._max_frame = 0

    def watch(self, send: object) -> bool:
        """Ask the connection behind an ASGI `send` to pause and resume this outbox."""
        protocol = _connection_of(send)
        transport = getattr(protocol, "transport", None)
        if transport is None or not hasattr(transport, "registerProducer"):
            return False
        try:
            # The HTTP channel that upgraded this socket is still registered as the
            # connection's producer; it reads nothing any more, and a connection has one.
            if getattr(transport, "producer", None) is not None:
                transport.unregisterProducer()
            transport.registerProducer(self, True)
        except Exception:
            log.warning("no flow control for this socket: it is never cut for being slow", exc_info=True)
            return False
        self._protocol = protocol
        self._as_built = _plain_frames(protocol)
        self._max_frame = int(getattr(protocol, "maxMessagePayloadSize", 0) or 0)  # 0: no limit
        return True

    def offer(self, html: str, frame: bytes | None = None) -> bool:
        """The fast path, per frame and member: write the frame now, without a coroutine,
        when the connection keeps up and nothing waits before it; False when the caller
        must `await put(html)` instead. What Channels' `send` would do, less its three
        layers of calls (the consumer's, the session middleware's, Daphne's dispatch)
        (docs/benchmarks/2026-12-02.md#b-nothing-lost). `frame`: the frame's WebSocket bytes,
        built once for a room's sockets (collab/chat/fanout.py, wsbytes.py), written to
        the transport as they are; else autobahn's own `sendMessage` frames the text."""
        protocol = self._protocol
        if protocol is None or self.paused or self._task is not None or self.overflowed:
            return False
        if protocol.state != protocol.STATE_OPEN:
            return False  # closing: put() goes the usual way, which ignores a closed socket
        if frame is None:
            protocol.sendMessage(html.encode(), False)
        elif (
            self._as_built
            and not protocol.send_queue
            and protocol._perMessageCompress is None
            and not (self._max_frame and wsbytes.payload_size(frame) > self._max_frame)
        ):
            protocol.transport.write(frame)
        else:
            protocol.sendMessage(wsbytes.payload(frame), False)
        return True

    def push(self, html: str, frame: bytes | None = None) -> None:
        """`put` without waiting, for the room's fan-out (collab/chat/fanout.py): written
        now when the connection keeps up, else queued behind what waits, in order."""
        if self.overflowed or self.offer(html, frame):
            return
        self._enqueue(html)

    # Twisted's IPushProducer: the connection calls these as its send buffer fills and drains.
    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False
        if self._wake is not None:
            self._wake.set()

    def stopProducing(self) -> None:  # the connection is gone
        self.paused = True
        self._queue = None
        self._bytes = 0

    async def put(self, html: str) -> None:
        if self.overflowed or self.offer(html):
            return
        if not self.paused and self._task is None:
            await self._send(html)
            return
        self._enqueue(html)

    def _enqueue(self, html: str) -> None:
        if self._queue is None:
            self._queue = deque()
        self._queue.append(html)
        self._bytes += len(html.encode())
        loop = asyncio.get_running_loop()
        if len(self._queue) > self.max_frames or self._bytes > self.max_bytes:
            self.overflowed = True
            self._queue = None
            self._bytes = 0
            metrics.SOCKETS_TOO_SLOW.inc()
            self._closing = loop.create_task(self._on_overflow())  # held: a task only weakly referenced may vanish
            return
        if self._task is None:
            self._task = loop.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while (queue := self._queue) and not self.overflowed:
                if self.paused:
                    if self._wake is None:
                        self._wake = asyncio.Event()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                html = queue.popleft()
                self._bytes -= len(html.encode())
                await self._send(html)
        except Exception:  # the socket closed meanwhile
            log.debug("outbox stopped", exc_info=True)
        finally:
            self._task = None

    async def flush(self) -> None:
        """Wait until what waits here is written (at most FLUSH_S: a stalled client is not
        waited for): a socket about to close sends its last frames first, in order."""
        task = self._task
        if task is not None and not self.overflowed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), FLUSH_S)

    def close(self) -> None:
        self.overflowed = True
        self._queue = None
        if self._wake is not None:
            self._wake.set()


def _plain_frames(protocol: Any) -> bool:
    """Whether this socket's text frames are exactly `wsbytes.text_frame`'s bytes: autobahn
    would send them unmasked, unfragmented and uncompressed, with no timings to track and
    no frames or octets to log (Daphne's settings; an unknown protocol object: no). The
    bytes skip only autobahn's traffic counters, which nothing here reads. A frame past
    the socket's size limit is left to autobahn, which refuses it."""
    try:
        return (
            protocol.factory.isServer
            and not protocol.maskServerFrames
            and not protocol.autoFragmentSize
            and not protocol.trackedTimings
            and not protocol.logOctets
            and not protocol.logFrames
            and protocol._perMessageCompress is None
            and isinstance(protocol.send_queue, deque)
        )
    except AttributeError:
        return False


def _connection_of(send: object) -> Any | None:
    """Daphne's protocol object behind a consumer's `send`: Daphne passes
    `partial(server.handle_reply, protocol)`, which Channels' session middleware wraps
    in a bound method keeping it as `real_send`."""
    for _ in range(4):
        if isinstance(send, functools.partial):
            protocol = send.args[0] if send.args else None
            return protocol if hasattr(protocol, "registerProducer") else None
        send = getattr(getattr(send, "__self__", None), "real_send", None)
        if send is None:
            return None
    return None
