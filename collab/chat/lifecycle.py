"""A server process's own background work, and its orderly end.

Started with the process's first socket (`ensure_started`):

- control: listens on the channel layer's processes group and stops the replies this
  process runs when any process asks (a stop sent to another process, stop-all);
- heartbeat, every HEARTBEAT_S: renews the leases of its replies, the presence of its
  sockets and the provider slots it holds, in the shared state, and publishes its
  status there (`Runtime.status`: what the admin's live page shows of it);
- sweep, every SWEEP_S (and once at start): any process finishes, as `interrupted`
  with their text, the replies whose lease ran out (their process died) and those left
  `streaming` in the database with no lease at all; it also drops dead sockets from
  presence and announces the member lists that changed.

On SIGTERM or SIGINT (`drain`): refuse new sockets (at the handshake) and new actions,
let running replies finish for COLLAB_DRAIN_S seconds while the open sockets still get
their frames, stop the rest as `interrupted` with their text, mark this process's
sockets offline, then stop the server: its sockets drop and the pages reconnect (to
another process behind the proxy). A second signal cuts the wait short.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import socket
import sys
from datetime import timedelta
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from collab.chat import broadcast, fanout, metrics, replies, shared
from collab.chat.events import PROCESSES_GROUP
from collab.chat.generation import registry
from collab.chat.models import Message
from collab.chat.repair import repair
from collab.chat.replies import steering
from collab.chat.replies.interrupt import interrupt
from collab.chat.services import presence, rooms
from collab.chat.services.providers import deployment_slots
from collab.chat.shared.base import LEASE_TTL_S
from collab.llm.client import aclose_clients

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0  # well inside the shared state's 6 s leases: two beats may be missed
SWEEP_S = 2.0  # a dead process's replies are interrupted within lease 6 s + this
ORPHAN_GRACE_S = 15.0  # a `streaming` reply no process has leased for this long is an orphan
LOOP_LAG_EVERY_S = 0.02  # the loop-lag probe's timer (metrics.LOOP_LAG)
RELEASE_AFTER_RESTART_S = 10.0  # leases are trusted this long after the shared state (re)started


def _unleased_candidates(grace_s: float) -> list[int]:
    cutoff = timezone.now() - timedelta(seconds=grace_s)
    # A continued reply is old but began streaming again just now: its grace counts from then.
    began = Q(restarted_at__isnull=True, created_at__lt=cutoff) | Q(restarted_at__lt=cutoff)
    rows = Message.objects.filter(began, status=Message.Status.STREAMING)
    return list(rows.values_list("id", flat=True)[:500])


async def sweep_once(grace_s: float = ORPHAN_GRACE_S) -> list[int]:
    """Finish what dead processes left behind; returns the replies it interrupted."""
    state = shared.backend()
    ended: list[int] = []
    # Leases are trusted only once their owners have had the time to renew them: right after
    # Redis restarted (empty) every running reply looks unleased for a beat.
    if await state.uptime_s() < RELEASE_AFTER_RESTART_S:
        return ended
    for reply_id in await state.expired_leases():
        if registry.get(reply_id) is None:  # ours renew their lease; a stalled loop keeps them
            await interrupt(reply_id)
            ended.append(reply_id)
    candidates = [i for i in await database_sync_to_async(_unleased_candidates)(grace_s) if registry.get(i) is None]
    leased = await state.leased(candidates)
    for reply_id in candidates:
        if reply_id not in leased:
            await interrupt(reply_id)
            ended.append(reply_id)
    for room_id in await state.sweep_presence():
        await rooms.announce_members(room_id)
    if ended:
        log.warning("interrupted %d replies that no process was running: %s", len(ended), ended)
    return ended


class Runtime:
    def __init__(self) -> None:
        self.enabled = bool(settings.COLLAB["BACKGROUND"])
        self.draining = False
        self._actions = 0  # socket actions under way (a post may be about to start replies)
        self._no_actions = asyncio.Event()
        self._no_actions.set()
        self.sockets: dict[str, tuple[int, int]] = {}  # this process's sockets: channel name -> (room, user)
        # Staff watching a room read-only: no presence, but resynced and counted like the others.
        self.watchers: dict[str, tuple[int, int]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._drain: asyncio.Task[None] | None = None
        # The layer or the shared state was away (or Redis restarted): frames may have been
        # lost, and the list layer's groups with them. Cleared once a ping this process sends
        # itself through the layer comes back, when every open socket is sent its snapshot again.
        self._stale = False
        self._uptime: float | None = None
        self._failed_at = -math.inf  # when a heartbeat last failed (loop time)
        self._control_channel: str | None = None
        # Sharded layer: the ping goes through one group per Redis server (broadcast.server_groups),
        # and the sockets are resynced once every one came back (each server's subscriptions are back).
        self._ping_groups = broadcast.server_groups(f"collab.ping.{shared.PROCESS_ID}")
        self._pinged: set[str] = set()

    @property
    def stale(self) -> bool:
        return self._stale

    @stale.setter
    def stale(self, away: bool) -> None:
        self._stale = away
        if away:
            self._pinged.clear()
        replies.distrust(away)  # frames lost unseen: what this process knows of its rooms is not trusted

    def ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if not self.enabled or self._loop is loop:
            return
        self._loop = loop
        for job in (self._control, self._heartbeat, self._sweeper, self._loop_lag):
            task = loop.create_task(job(), name=f"collab-{job.__name__.strip('_')}")
            self._tasks.add(task)
        self._install_sigterm(loop)

    # --- the loops ------------------------------------------------------------------------------

    async def _control(self) -> None:
        layer = get_channel_layer()
        assert layer is not None
        while True:
            try:
                channel = await layer.new_channel()
                await broadcast.join(PROCESSES_GROUP, channel)
                for group in self._ping_groups:
                    await broadcast.join(group, channel)
                self._control_channel = channel
                while True:
                    self.on_control(await layer.receive(channel))
            except Exception:
                self.stale = True
                log.warning("control channel failed; listening again in 1 s", exc_info=True)
                await asyncio.sleep(1)

    def on_control(self, event: dict[str, Any]) -> None:
        if event.get("type") == "process.ping":
            if event.get("process") == shared.PROCESS_ID and self.stale:
                self._pinged.add(str(event.get("via", "")))
                if not self._pinged.issuperset(self._ping_groups):
                    return  # a server has not delivered it yet
                self.stale = False
                self._spawn(self._resync_sockets())
        elif event.get("type") == "reply.stop":
            registry.stop(int(event["message_id"]), str(event.get("reason", "stopped")))
        elif event.get("type") == "reply.steer" and registry.get(int(event["message_id"])) is not None:
            self._spawn(steering.on_control(event))  # type: ignore[arg-type]  # its owner: here
        elif event.get("type") == "context.changed":
            room_id = event.get("room_id")
            if room_id is None:
                replies.forget(None)
            else:
                replies.forget(int(room_id))
        elif event.get("type") == "room.stop_all":
            for reply_id in registry.in_room(int(event["room_id"])):
                registry.stop(reply_id)

    async def _loop_lag(self) -> None:
        """How late this process's event loop runs a timer: every stall of the loop (a
        long callback, the GIL held by another thread) delays every frame of every room
        by as much (docs/benchmarks.md; the load test reports it per level)."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LOOP_LAG_EVERY_S
            await asyncio.sleep(LOOP_LAG_EVERY_S)
            metrics.LOOP_LAG.observe(max(0.0, loop.time() - due))

    async def _heartbeat(self) -> None:
        while True:
            await self.heartbeat()
            await asyncio.sleep(HEARTBEAT_S)

    async def heartbeat(self) -> None:
        """One beat. A failed one marks the process stale (its sockets are resynced once
        the layer answers again) and holds its sweeps off for a while (`sweep`)."""
        try:
            await self.beat()
        except Exception as exc:
            if not self.stale:
                log.warning("heartbeat failed: %r; the sockets are resynced when it is back", exc)
            self.stale = True
            self._failed_at = asyncio.get_running_loop().time()

    async def beat(self) -> None:
        state = shared.backend()
        uptime = await state.uptime_s()
        restarted = self._uptime is not None and uptime < self._uptime  # it lost what it held
        if restarted:
            log.warning("the shared state restarted; restoring leases and presence, resyncing sockets")
            self.stale = True
        self._uptime = uptime
        if self.stale:  # the replies' records first: the sockets' snapshots will read them
            for live in registry.running():
                restore = getattr(live.sink, "restore_locked", None)
                if restore is not None and (restarted or getattr(live.sink, "lost", False)):
                    with contextlib.suppress(shared.ReplyEnded):
                        await restore()
        await state.renew_leases(registry.ids())
        sockets = [(room, user, name) for name, (room, user) in self.sockets.items()]
        for room_id in await state.renew_presence(sockets):
            await rooms.announce_members(room_id)
        await state.renew_slots(deployment_slots.held)
        await state.publish_status(shared.PROCESS_ID, json.dumps(self.status()))
        try:  # a final frame some socket here never got: sent again (not a failure of the shared state)
            await repair.check()
        except Exception:
            log.warning("could not check the sockets for finals they missed", exc_info=True)
        if self.stale and self._control_channel is not None:
            await broadcast.join(PROCESSES_GROUP, self._control_channel)  # the list layer may have lost it
            ping = {"type": "process.ping", "process": shared.PROCESS_ID}
            for group in self._ping_groups:  # sharded: through every server
                await broadcast.join(group, self._control_channel)
                await broadcast.to_group(group, {**ping, "via": group})
            if not self._ping_groups:
                await broadcast.to_channel(self._control_channel, ping)

    def status(self) -> dict[str, Any]:
        """What the admin's live page shows of this process, published every beat:
        {"process", "pid", "host", "draining", "stale", "sockets": {room: {user: count}},
        "watchers": {room: count}, "replies": [generation.LiveReply.status(), ...]} (room and
        user ids as text: JSON). Watchers are staff viewing a room read-only: not online."""
        sockets: dict[str, dict[str, int]] = {}
        for room_id, user_id in list(self.sockets.values()):
            per_user = sockets.setdefault(str(room_id), {})
            per_user[str(user_id)] = per_user.get(str(user_id), 0) + 1
        watchers: dict[str, int] = {}
        for room_id, _user in list(self.watchers.values()):
            watchers[str(room_id)] = watchers.get(str(room_id), 0) + 1
        return {
            "process": shared.PROCESS_ID,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "draining": self.draining,
            "stale": self.stale,
            "sockets": sockets,
            "watchers": watchers,
            "replies": [live.status() for live in registry.running()],
        }

    async def _resync_sockets(self) -> None:
        """The layer is back: every open socket gets the room's snapshot again (lost frames,
        replies that ended meanwhile) and rejoins its groups."""
        names = [*self.sockets, *self.watchers]
        log.warning("the channel layer is back: resyncing %d sockets", len(names))
        for name in names:
            try:
                await broadcast.to_channel(name, {"type": "room.resync"})
            except Exception:
                self.stale = True  # away again: the next beat tries again
                return

    def _spawn(self, job: Any) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sweeper(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:
                log.warning("sweep failed", exc_info=True)
            await asyncio.sleep(SWEEP_S)

    async def sweep(self) -> list[int]:
        """`sweep_once`, but not while this process itself could not reach Redis lately
        (a heartbeat failed less than a lease and two beats ago): the other owners' leases
        may have run out for the same reason, and they still run, renewing them at their
        next beat (tests/test_sweeps.py)."""
        if asyncio.get_running_loop().time() - self._failed_at <= LEASE_TTL_S + 2 * HEARTBEAT_S:
            return []
        return await sweep_once()

    # --- sockets --------------------------------------------------------------------------------

    def action_started(self) -> None:
        self._actions += 1
        self._no_actions.clear()

    def action_ended(self) -> None:
        self._actions -= 1
        if not self._actions:
            self._no_actions.set()

    def socket_opened(self, channel_name: str, room_id: int, user_id: int, watcher: bool = False) -> None:
        (self.watchers if watcher else self.sockets)[channel_name] = (room_id, user_id)

    def socket_closed(self, channel_name: str) -> bool:
        """True when this process had the socket open (the first time only)."""
        found = self.sockets.pop(channel_name, None) or self.watchers.pop(channel_name, None)
        return found is not None

    # --- an orderly end -------------------------------------------------------------------------

    def _install_sigterm(self, loop: asyncio.AbstractEventLoop) -> None:
        """Under Daphne (Twisted's reactor on this loop), SIGTERM drains first: replace the
        reactor's own handler, which would stop at once and strand every running reply."""
        if "twisted.internet.reactor" not in sys.modules or not _is_main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):  # SIGINT: Ctrl-C in `make run` reaches Daphne too
            signal.signal(signum, lambda *_: loop.call_soon_threadsafe(self._on_sigterm))

    def _on_sigterm(self) -> None:
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self._drain_then_stop())
        else:  # a second SIGTERM: stop waiting
            for reply_id in registry.ids():
                registry.stop(reply_id, "interrupted")

    async def _drain_then_stop(self) -> None:
        try:
            await self.drain(float(settings.COLLAB["DRAIN_S"]))
        finally:
            from twisted.internet import reactor

            reactor.stop()  # type: ignore[attr-defined,misc]

    async def drain(self, grace_s: float) -> None:
        self.draining = True
        log.warning("draining: %d replies running, %d sockets open", len(registry), len(self.sockets))
        # The sockets stay open meanwhile: their members see the running replies end. (A
        # server may not send close code 1012 "service restart" (autobahn allows 1000 and
        # 3000-4999), and after 1000 htmx's ws extension would not reconnect: the sockets
        # drop when the server stops instead, and the pages reconnect.)
        with contextlib.suppress(TimeoutError):  # actions under way first: a post may start replies
            async with asyncio.timeout(grace_s):
                await self._no_actions.wait()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await registry.wait_idle()
        left = registry.ids()
        for reply_id in left:
            registry.stop(reply_id, "interrupted")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await registry.wait_idle()
        log.warning("drained: %d replies stored as interrupted", len(left))
        for task in self._tasks:
            task.cancel()
        with contextlib.suppress(TimeoutError):  # else their presence expires by itself
            async with asyncio.timeout(5):
                for name, (room_id, user_id) in list(self.sockets.items()):
                    with contextlib.suppress(Exception):
                        await presence.socket_closed(room_id, user_id, name)
                await presence.flush()
        with contextlib.suppress(Exception):  # the model clients' connections, closed cleanly
            await aclose_clients()


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


runtime = Runtime()


def _lost() -> None:
    runtime.stale = True


fanout.watchers.lost = _lost  # a room's frames could not be received: resync once the layer answers
