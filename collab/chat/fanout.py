"""A room's frames to this process's sockets: one receive per room per process.

Through Channels' groups, every frame costs each socket of the room a queue put, a task
wake-up, a decode of the message and a dispatch (docs/benchmarks/2026-12-03.md#b-fanout-hub). Here
the process joins each room's group once, with a channel of its own (a hub), and hands
every event to the room's sockets in one loop of plain calls: a frame is made into
WebSocket bytes once (wsbytes.py) and written to each socket at once (Outbox.offer) or
queued for it. Frames keep their order: one receive loop per room reads them as the
layer delivers them.

The sockets still have their own channels for what is theirs alone (a personal reply's
frames, a resync, their user's events). Events of the room's group other than frames
(`room.closed`) are forwarded to each socket's channel and handled there, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from channels.layers import get_channel_layer

from collab.chat import broadcast, metrics, wsbytes
from collab.chat.events import room_group

log = logging.getLogger(__name__)

RETRY_S = 1.0  # the layer failed under a hub: receive again after this (its sockets are resynced)


def _nothing(*args: Any) -> None:
    return None


@dataclass
class Watchers:
    """Who else wants to know what reaches this process: the reply pipeline keeps what it
    knows of a room current while the room's frames reach it (replies/early.py: watch,
    unwatch, saw), and the process notes an outage (lifecycle.py: lost). Set once at
    start-up by the layers above (replies.install, lifecycle), so that this module
    imports none of them."""

    watch: Callable[[int], None] = _nothing  # a room's frames reach this process from now on
    unwatch: Callable[[int], None] = _nothing  # ... no longer
    saw: Callable[[int, dict[str, Any]], None] = _nothing  # a room frame, as this process receives it
    lost: Callable[[], None] = _nothing  # frames could not be received: some may be lost


watchers = Watchers()


class Receiver(Protocol):
    channel_name: str
    floors: dict[int, float]  # per reply, the next offset it expects (consumers.RoomConsumer)

    def take_frame(self, event: Any, data: bytes | None) -> None: ...


class _Hub:
    def __init__(self, room_id: int, loop: asyncio.AbstractEventLoop) -> None:
        self.room_id = room_id
        self.loop = loop
        self.sockets: dict[str, Receiver] = {}
        self.channel: asyncio.Future[str] = loop.create_future()
        self.task = loop.create_task(self._run(), name=f"collab-room-{room_id}")
        # Counts what reached the room here that may change its snapshot (every event but a
        # piece, whose text is read live), and keeps what was read at one count (`keep`).
        self.version = 0
        self.kept: tuple[int, Any] | None = None

    async def _run(self) -> None:
        layer = get_channel_layer()
        assert layer is not None
        while True:
            try:
                if not self.channel.done():
                    self.channel.set_result(await layer.new_channel())
                name = self.channel.result()
                while True:
                    self.deliver(await layer.receive(name))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self.channel.done():  # join() is waiting for it: tell it
                    self.channel.set_exception(exc)
                    self.channel = self.loop.create_future()
                # Frames may be lost: the process resyncs its sockets once the layer answers
                # again (lifecycle.py, as after any outage), and forgets what it knew of its
                # rooms (replies/early.py).
                watchers.lost()
                self.version += 1
                self.kept = None
                log.warning("room %s: its frames could not be received; again in %s s", self.room_id, RETRY_S)
                await asyncio.sleep(RETRY_S)

    def deliver(self, event: dict[str, Any]) -> None:
        if event.get("kind") != "delta" and not event.get("ephemeral"):
            self.version += 1
            self.kept = None  # no longer current: not held either
        if event.get("type") != "room.frame":  # room.closed: each socket's own handler
            for name in list(self.sockets):
                task = self.loop.create_task(_forward(name, event))
                _forwarding.add(task)  # held until done: the loop keeps only a weak reference
                task.add_done_callback(_forwarding.discard)
            return
        metrics.FRAMES_RECEIVED.inc()
        watchers.saw(self.room_id, event)  # a frame it did not expect: what it knew of the room is forgotten
        data = wsbytes.text_frame(event["html"].encode())  # once for every socket of the room
        for receiver in list(self.sockets.values()):
            try:
                receiver.take_frame(event, data)
            except Exception:  # one socket's failure is not the room's
                log.exception("a frame could not be handed to socket %s", receiver.channel_name)


_forwarding: set[asyncio.Task[None]] = set()


async def _forward(name: str, event: dict[str, Any]) -> None:
    try:
        await broadcast.to_channel(name, event)
    except Exception:
        log.warning("could not forward %s to socket %s", event.get("type"), name, exc_info=True)


_hubs: dict[int, _Hub] = {}


async def join(room_id: int, receiver: Receiver) -> None:
    """From the return on, every event sent to the room's group reaches `receiver`, in
    order. Joins the group again each time (idempotent): a resync after an outage also
    rejoins in case the layer lost its groups."""
    loop = asyncio.get_running_loop()
    hub = _hubs.get(room_id)
    if hub is None or hub.loop is not loop:  # a hub of another loop (tests) is dropped
        if hub is not None and not hub.loop.is_closed():
            hub.loop.call_soon_threadsafe(hub.task.cancel)
        hub = _hubs[room_id] = _Hub(room_id, loop)
    hub.sockets[receiver.channel_name] = receiver
    await broadcast.join(room_group(room_id), await asyncio.shield(hub.channel))
    if _hubs.get(room_id) is hub:  # its frames reach this process: what it knows of the room stays current
        watchers.watch(room_id)


def leave(room_id: int, receiver: Receiver) -> None:
    """The socket gets nothing more; the room's last socket here ends the hub."""
    hub = _hubs.get(room_id)
    if hub is None or hub.sockets.get(receiver.channel_name) is not receiver:
        return
    del hub.sockets[receiver.channel_name]
    if not hub.sockets:
        del _hubs[room_id]
        watchers.unwatch(room_id)
        hub.task.cancel()  # the pub/sub layer unsubscribes the channel as its receive ends
        if hub.channel.done() and not hub.channel.cancelled() and hub.channel.exception() is None:
            hub.loop.create_task(_discard(room_id, hub.channel.result()))


async def _discard(room_id: int, channel: str) -> None:
    try:
        await broadcast.leave(room_group(room_id), channel)
    except Exception:  # the layer is away: the group membership expires
        log.warning("room %s: could not leave its group", room_id, exc_info=True)


def stamp(room_id: int) -> int | None:
    """What this process has seen of the room so far (a count), while its frames reach
    the process (a socket here has joined it); None otherwise. Equal stamps: nothing but
    pieces reached the room in between, so what was read of its database at the first
    is still what a reader at the second would read, or the frames that say otherwise are
    still on their way to every socket that joined (services/snapshot_cache.py)."""
    hub = _hubs.get(room_id)
    if hub is None or not hub.channel.done() or hub.loop is not asyncio.get_running_loop():
        return None
    return hub.version


def kept(room_id: int, at: int) -> Any:
    """What `keep` left for the room at stamp `at`, if the room is still at it."""
    hub = _hubs.get(room_id)
    if hub is None or hub.version != at or hub.kept is None or hub.kept[0] != at:
        return None
    return hub.kept[1]


def keep(room_id: int, at: int, value: Any) -> None:
    """Leave `value` with the room while its stamp stays `at` (dropped with the hub)."""
    hub = _hubs.get(room_id)
    if hub is not None and hub.version == at:
        hub.kept = (at, value)


def receivers() -> list[Receiver]:
    """Every socket this process serves a room to."""
    return [r for hub in list(_hubs.values()) for r in hub.sockets.values()]


def sockets_in(room_id: int) -> int:
    """How many sockets of the room this process serves (tests, the admin's numbers)."""
    hub = _hubs.get(room_id)
    return len(hub.sockets) if hub is not None else 0
