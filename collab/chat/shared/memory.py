"""The shared state of a deployment that is one process (no Redis): plain dicts.

Nothing expires here: a process that dies takes this state with it, and the next one
finds its replies `streaming` in the database with no lease (lifecycle's sweep).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from collab.chat.shared.base import (
    KEEP_ENDED_S,
    STATUS_TTL_S,
    LiveView,
    OnQueued,
    ProcessStatus,
    ReplyEnded,
    SharedState,
)


@dataclass
class _Live:
    parts: list[str] = field(default_factory=list)
    state: str = ""
    ended: bool = False
    thinking: list[str] = field(default_factory=list)


@dataclass
class _Slots:
    running: set[str] = field(default_factory=set)
    waiters: deque[tuple[str, asyncio.Future[None]]] = field(default_factory=deque)


class MemoryState(SharedState):
    def __init__(self) -> None:
        self._live: dict[int, _Live] = {}
        self._ended: deque[tuple[float, int]] = deque()
        self._buckets: dict[str, tuple[float, float]] = {}
        self._sockets: dict[int, dict[str, int]] = defaultdict(dict)  # room -> socket -> user
        self._slots: dict[str, _Slots] = defaultdict(_Slots)
        self._statuses: dict[str, tuple[float, str]] = {}  # process -> (published at, status)

    # --- live replies ----------------------------------------------------------------------

    async def begin(self, reply_id: int, room_id: int, owner: str) -> None:
        self._live[reply_id] = _Live()

    async def append(self, reply_id: int, text: str, at_bytes: int, thinking: bool = False) -> None:
        live = self._live.get(reply_id)
        if live is not None and live.ended:
            raise ReplyEnded(reply_id)
        if live is not None:
            (live.thinking if thinking else live.parts).append(text)

    async def set_state(self, reply_id: int, state: str) -> None:
        live = self._live.get(reply_id)
        if live is not None:
            live.state = state

    async def restore(self, reply_id: int, room_id: int, owner: str, text: str, state: str, thinking: str = "") -> None:
        live = self._live.get(reply_id)
        if live is not None and live.ended:
            raise ReplyEnded(reply_id)
        self._live[reply_id] = _Live([text], state, thinking=[thinking])

    async def uptime_s(self) -> float:
        # This process is the whole deployment: no other owner can be missing a lease.
        return math.inf

    async def end(self, reply_id: int) -> None:
        # Kept a while as "ended" (a snapshot racing the final article must know); then dropped.
        live = self._live.get(reply_id)
        if live is not None:
            live.ended = True
            self._ended.append((time.monotonic(), reply_id))
        while self._ended and self._ended[0][0] < time.monotonic() - KEEP_ENDED_S:
            old = self._ended.popleft()[1]
            if self._live.get(old, _Live(ended=True)).ended:  # not one begun again since (continue)
                self._live.pop(old, None)

    async def read(self, reply_ids: Sequence[int]) -> dict[int, LiveView]:
        out = {}
        for i in reply_ids:
            live = self._live.get(i)
            if live is not None:
                out[i] = LiveView("".join(live.parts), live.state, live.ended, "".join(live.thinking))
        return out

    async def renew_leases(self, reply_ids: Iterable[int]) -> None:
        return None

    async def expired_leases(self) -> list[int]:
        return []

    async def leased(self, reply_ids: Sequence[int]) -> set[int]:
        return {i for i in reply_ids if i in self._live and not self._live[i].ended}

    # --- posting rate ----------------------------------------------------------------------

    async def take(self, key: str, burst: float, refill_s: float) -> bool:
        now = time.monotonic()
        tokens, at = self._buckets.get(key, (burst, now))
        tokens = min(burst, tokens + (now - at) / refill_s)
        ok = tokens >= 1
        self._buckets[key] = (tokens - 1 if ok else tokens, now)
        return ok

    # --- presence ----------------------------------------------------------------------------

    async def join(self, room_id: int, user_id: int, socket: str) -> bool:
        sockets = self._sockets[room_id]
        was = user_id in sockets.values()
        sockets[socket] = user_id
        return not was

    async def leave(self, room_id: int, user_id: int, socket: str) -> bool:
        sockets = self._sockets.get(room_id, {})
        if sockets.pop(socket, None) is None:
            return False
        return user_id not in sockets.values()

    async def renew_presence(self, sockets: Iterable[tuple[int, int, str]]) -> list[int]:
        return []

    async def online(self, room_id: int) -> set[int]:
        return set(self._sockets.get(room_id, {}).values())

    async def sweep_presence(self) -> list[int]:
        return []

    # --- deployment-wide provider cap (one process: first come, first served) --------------

    async def acquire_slot(self, name: str, cap: int, token: str, on_queued: OnQueued | None) -> None:
        slots = self._slots[name]
        if len(slots.running) < cap and not slots.waiters:
            slots.running.add(token)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        slots.waiters.append((token, waiter))
        try:
            if on_queued is not None:
                await on_queued(len(slots.waiters))
            await waiter  # release_slot hands its slot straight over
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                await self.release_slot(name, token)
            else:
                slots.waiters.remove((token, waiter))
            raise

    async def release_slot(self, name: str, token: str) -> None:
        slots = self._slots[name]
        slots.running.discard(token)
        while slots.waiters:
            next_token, waiter = slots.waiters.popleft()
            if not waiter.done():
                slots.running.add(next_token)
                waiter.set_result(None)
                return

    async def renew_slots(self, held: Iterable[tuple[str, str]]) -> None:
        return None

    # --- each process's status ---------------------------------------------------------------

    async def publish_status(self, process: str, status: str) -> None:
        self._statuses[process] = (time.monotonic(), status)

    async def process_statuses(self) -> list[ProcessStatus]:
        now = time.monotonic()
        for process in [p for p, (at, _) in self._statuses.items() if now - at >= STATUS_TTL_S]:
            del self._statuses[process]
        return [ProcessStatus(p, status, now - at) for p, (at, status) in self._statuses.items()]
