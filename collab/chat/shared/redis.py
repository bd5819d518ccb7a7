"""The shared state in Redis, for several server processes (docs/architecture.md#a-shared-state).

Keys, under the prefix (`COLLAB_REDIS_PREFIX`, default `collab:`):

    r:{id}          hash   a live reply: room, owner, state, ended
    r:{id}:t        string its text so far (APPEND per flushed piece, read whole)
    r:{id}:k        string its thinking so far (a reasoning model's; the same way)
    leases          zset   reply id -> lease deadline (Redis clock); the owner renews it
    rate:{key}      hash   a posting token bucket
    pr:{room}       zset   "user:socket" -> presence deadline
    pr:rooms        set    the presence zsets in use (swept by every process)
    slot:{name}:*   zsets  a provider's slot holders and waiters (first come, first served)
    ps:{process}    string a process's status (JSON); expires (its age: the TTL it has left)
    ps              set    the processes that published one (pruned once theirs expired)

Deadlines use Redis's own clock (TIME inside scripts), so processes on machines whose
clocks disagree still agree on what has expired.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ConstantBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

from collab.chat.shared.base import (
    KEEP_ENDED_S,
    LEASE_TTL_S,
    PRESENCE_TTL_S,
    SLOT_TTL_S,
    STATUS_TTL_S,
    LiveView,
    OnQueued,
    ProcessStatus,
    ReplyEnded,
    SharedState,
    StateLost,
)
from collab.chat.shared.batch import ScriptBatch
from collab.chat.shared.redis_scripts import (
    ACQUIRE,
    APPEND_PUBLISH,
    EXPIRED,
    JOIN,
    LEASE,
    LEAVE,
    ONLINE,
    RENEW,
    RENEW_LEASES,
    RENEW_PRESENCE,
    RESTORE,
    SWEEP_PRESENCE,
    TAKE,
)

KEEP_LIVE_S = 24 * 3600  # a safety net: no key outlives a day, whatever happens
SLOT_POLL_S = 0.05  # a queued request asks again this often (a slot frees on any process)


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def user_ids(members: Iterable[Any]) -> set[int]:
    """Presence members ("user:socket") -> user ids."""
    return {int(_decode(m).split(":", 1)[0]) for m in members}


class _Connection(aioredis.Connection):
    """redis-py's connection, writing a small command in place. With `socket_timeout`
    set, redis-py writes each command under `asyncio.wait_for`, which on Python 3.11
    runs the write in a task of its own, and a frame costs a command
    (docs/benchmarks/2026-12-04.md#b-frame-path). A command smaller than the write
    buffer's high-water mark, written into an empty buffer, cannot wait in `drain()`, so
    the timeout has nothing to bound; its reply is still read under `socket_timeout`
    (tests/test_shared_state.py: a Redis that never answers). Any other write goes
    redis-py's way."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        writer = self._writer
        if (
            type(command) is list
            and writer is not None
            and self._reader is not None  # connected
            and not self.health_check_interval
            and not writer.transport.is_closing()
            and not writer.transport.get_write_buffer_size()
            and sum(map(len, command)) < writer.transport.get_write_buffer_limits()[1]
        ):
            writer.writelines(command)
            return
        await super().send_packed_command(command, check_health)


def _connection_class(url: str) -> dict[str, Any]:
    """`_Connection` for a plain TCP URL on Python 3.11 (3.12 waits without a task); a
    TLS (rediss://) or Unix socket URL keeps the class redis-py picks for it."""
    if sys.version_info < (3, 12) and url.lower().startswith("redis://"):
        return {"connection_class": _Connection}
    return {}


class RedisState(SharedState):
    def __init__(self, url: str, prefix: str) -> None:
        # One quick retry of a connection that failed (a pooled one Redis closed), none of a
        # timeout (the command may have run), not redis-py's default three with a backoff of
        # seconds: while Redis is away every caller should learn it at once and carry on.
        self.redis = aioredis.Redis.from_url(
            url,
            socket_connect_timeout=2,
            socket_timeout=5,
            **_connection_class(url),
            retry=Retry(ConstantBackoff(0.05), 1, supported_errors=(RedisConnectionError,)),
        )
        self.p = prefix
        self._renew = self.redis.register_script(RENEW)
        self._renew_leases = self.redis.register_script(RENEW_LEASES)
        self._renew_presence = self.redis.register_script(RENEW_PRESENCE)
        self._expired = self.redis.register_script(EXPIRED)
        self._lease = self.redis.register_script(LEASE)
        self._take = self.redis.register_script(TAKE)
        self._join = self.redis.register_script(JOIN)
        self._leave = self.redis.register_script(LEAVE)
        self._sweep_presence = self.redis.register_script(SWEEP_PRESENCE)
        self._acquire = self.redis.register_script(ACQUIRE)
        self._online = self.redis.register_script(ONLINE)
        self._append_publish = self.redis.register_script(APPEND_PUBLISH)
        self._pieces = ScriptBatch(self.redis, self._append_publish)  # every reply's piece of a window: one pipeline
        self._restore = self.redis.register_script(RESTORE)

    async def close(self) -> None:
        await self.redis.aclose()

    # --- live replies ----------------------------------------------------------------------

    def _r(self, reply_id: int) -> str:
        return f"{self.p}r:{reply_id}"

    async def begin(self, reply_id: int, room_id: int, owner: str) -> None:
        key = self._r(reply_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(key + ":t", "", ex=KEEP_LIVE_S)
            pipe.set(key + ":k", "", ex=KEEP_LIVE_S)
            pipe.delete(key)  # a new reply: nothing of an earlier one with this id (a fresh database) is kept
            pipe.hset(key, mapping={"room": room_id, "owner": owner, "state": ""})
            pipe.expire(key, KEEP_LIVE_S)
            # By its SHA alone: a registered script in a pipeline asks SCRIPT EXISTS first
            # (redis-py's `load_scripts`), a round trip more for every reply.
            pipe.evalsha(self._lease.sha, 1, self.p + "leases", LEASE_TTL_S, reply_id)
            try:
                await pipe.execute()
            except NoScriptError:  # a Redis that lost it (restarted): the rest ran; loaded, and the lease taken
                await self._lease(keys=[self.p + "leases"], args=[LEASE_TTL_S, reply_id])

    async def append(self, reply_id: int, text: str, at_bytes: int, thinking: bool = False) -> None:
        await self.append_and_publish(reply_id, text, at_bytes, "", b"", thinking)

    async def append_and_publish(
        self, reply_id: int, text: str, at_bytes: int, channel: str, payload: bytes, thinking: bool = False
    ) -> bool:
        key = self._r(reply_id)
        keys = [key + (":k" if thinking else ":t"), key]
        done = int(await self._pieces(keys, [text, channel, payload, at_bytes]))
        if done == -1:
            raise ReplyEnded(reply_id)
        if done == -2:
            raise StateLost(reply_id)
        return True

    async def restore(self, reply_id: int, room_id: int, owner: str, text: str, state: str, thinking: str = "") -> None:
        key = self._r(reply_id)
        args: list[str | int | float] = [text, room_id, owner, state, KEEP_LIVE_S, LEASE_TTL_S, reply_id, thinking]
        if int(await self._restore(keys=[key + ":t", key, self.p + "leases", key + ":k"], args=args)) < 0:
            raise ReplyEnded(reply_id)

    async def uptime_s(self) -> float:
        info = await self.redis.info("server")
        return float(info["uptime_in_seconds"])

    async def set_state(self, reply_id: int, state: str) -> None:
        await self.redis.hset(self._r(reply_id), "state", state)

    async def end(self, reply_id: int) -> None:
        key = self._r(reply_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrem(self.p + "leases", reply_id)
            pipe.hset(key, "ended", 1)
            pipe.expire(key, int(KEEP_ENDED_S))
            pipe.expire(key + ":t", int(KEEP_ENDED_S))
            pipe.expire(key + ":k", int(KEEP_ENDED_S))
            await pipe.execute()

    async def read(self, reply_ids: Sequence[int]) -> dict[int, LiveView]:
        if not reply_ids:
            return {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for i in reply_ids:
                pipe.hmget(self._r(i), "state", "ended")
                pipe.get(self._r(i) + ":t")
                pipe.get(self._r(i) + ":k")
            rows = await pipe.execute()
        out = {}
        for n, i in enumerate(reply_ids):
            (state, ended), text, thinking = rows[3 * n], rows[3 * n + 1], rows[3 * n + 2]
            if text is not None:
                out[i] = LiveView(_decode(text), _decode(state), bool(ended), _decode(thinking))
        return out

    async def renew_leases(self, reply_ids: Iterable[int]) -> None:
        ids = list(reply_ids)
        if ids:
            await self._renew_leases(keys=[self.p + "leases"], args=[LEASE_TTL_S, *ids])

    async def expired_leases(self) -> list[int]:
        return [int(_decode(i)) for i in await self._expired(keys=[self.p + "leases"])]

    async def leased(self, reply_ids: Sequence[int]) -> set[int]:
        if not reply_ids:
            return set()
        scores = await self.redis.zmscore(self.p + "leases", [str(i) for i in reply_ids])
        return {i for i, s in zip(reply_ids, scores, strict=True) if s is not None}

    # --- posting rate ----------------------------------------------------------------------

    async def take(self, key: str, burst: float, refill_s: float) -> bool:
        return bool(await self._take(keys=[f"{self.p}rate:{key}"], args=[burst, refill_s]))

    # --- presence ----------------------------------------------------------------------------

    async def join(self, room_id: int, user_id: int, socket: str) -> bool:
        keys = [f"{self.p}pr:{room_id}", f"{self.p}pr:rooms"]
        return bool(await self._join(keys=keys, args=[f"{user_id}:{socket}", PRESENCE_TTL_S, f"{user_id}:"]))

    async def leave(self, room_id: int, user_id: int, socket: str) -> bool:
        keys = [f"{self.p}pr:{room_id}"]
        return bool(await self._leave(keys=keys, args=[f"{user_id}:{socket}", f"{user_id}:"]))

    async def renew_presence(self, sockets: Iterable[tuple[int, int, str]]) -> list[int]:
        by_room: dict[int, list[str]] = {}
        for room_id, user_id, socket in sockets:
            by_room.setdefault(room_id, []).append(f"{user_id}:{socket}")
        if not by_room:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for room_id, members in by_room.items():
                keys = [f"{self.p}pr:{room_id}"]
                await self._renew_presence(keys=keys, args=[PRESENCE_TTL_S, *members], client=pipe)
            added = await pipe.execute()
        return [room_id for room_id, n in zip(by_room, added, strict=True) if n]

    async def online(self, room_id: int) -> set[int]:
        return user_ids(await self._online(keys=[f"{self.p}pr:{room_id}"]))

    async def sweep_presence(self) -> list[int]:
        changed = await self._sweep_presence(keys=[f"{self.p}pr:rooms"])
        return [int(_decode(k).rsplit(":", 1)[1]) for k in changed]

    # --- deployment-wide provider cap --------------------------------------------------------

    def _slot_keys(self, name: str) -> list[str]:
        base = f"{self.p}slot:{name}:"
        return [base + "holders", base + "waiters", base + "alive", base + "seq"]

    async def acquire_slot(self, name: str, cap: int, token: str, on_queued: OnQueued | None) -> None:
        keys = self._slot_keys(name)
        told = 0
        try:
            while True:
                ahead = int(await self._acquire(keys=keys, args=[token, cap, SLOT_TTL_S]))
                if ahead == 0:
                    return
                if ahead != told and on_queued is not None:
                    told = ahead
                    await on_queued(ahead)
                # A slot may free on any process: ask again shortly (there is no event
                # to wait on across processes that would also survive one dying).
                await asyncio.sleep(SLOT_POLL_S)
        except BaseException:
            await asyncio.shield(self.release_slot(name, token))
            raise

    async def release_slot(self, name: str, token: str) -> None:
        holders, waiters, alive, _ = self._slot_keys(name)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrem(holders, token)
            pipe.zrem(waiters, token)
            pipe.zrem(alive, token)
            await pipe.execute()

    async def renew_slots(self, held: Iterable[tuple[str, str]]) -> None:
        by_name: dict[str, list[str]] = {}
        for name, token in held:
            by_name.setdefault(name, []).append(token)
        if not by_name:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for name, tokens in by_name.items():
                await self._renew(keys=[self._slot_keys(name)[0]], args=[SLOT_TTL_S, *tokens], client=pipe)
            await pipe.execute()

    # --- each process's status ---------------------------------------------------------------

    async def publish_status(self, process: str, status: str) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(f"{self.p}ps:{process}", status, px=int(STATUS_TTL_S * 1000))
            pipe.sadd(f"{self.p}ps", process)
            await pipe.execute()

    async def process_statuses(self) -> list[ProcessStatus]:
        processes = [_decode(p) for p in await self.redis.smembers(f"{self.p}ps")]
        async with self.redis.pipeline(transaction=False) as pipe:
            for process in processes:
                pipe.get(f"{self.p}ps:{process}")
                pipe.pttl(f"{self.p}ps:{process}")
            rows = await pipe.execute()
        out, gone = [], []
        for n, process in enumerate(processes):
            status, ttl_ms = rows[2 * n], rows[2 * n + 1]
            if status is None or ttl_ms < 0:
                gone.append(process)
            else:  # its age, on Redis's clock: how much of its TTL has run
                out.append(ProcessStatus(process, _decode(status), max(0.0, STATUS_TTL_S - ttl_ms / 1000)))
        if gone:
            await self.redis.srem(f"{self.p}ps", *gone)
        return out
