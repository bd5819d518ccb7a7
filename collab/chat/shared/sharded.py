"""The shared state over several Redis servers (docs/architecture.md#a-sharding).

One `RedisState` per URL, each with the same key layout (redis.py) on its own server; this
router picks the server of every call by a stable hash:

- a room's presence (`pr:{room}`) by the room's id;
- a live reply's keys (`r:{id}`, `r:{id}:t`, `r:{id}:k`, its entry in `leases`) by the
  reply's id, so every call about a reply finds it, whoever makes it and whatever it
  knows; each server has its own `leases` zset and `pr:rooms` set, and every Lua script
  touches the keys of one reply, one room or one bucket: none spans servers;
- a rate bucket by its key, a provider's slots by the provider's name;
- the processes' statuses (the admin's live page) on the first server.

What asks about every reply or room at once (expired leases, presence sweeps) asks every
server. The hash is channels_redis's own (crc32 of the name into 4,096 slots, cut into
equal ranges), so when the channel layer has the same hosts in the same order a piece
whose group channel lives on its reply's server is still appended and published in one
command (`append_and_publish`); the others take two (broadcast.piece_to_room).
"""

from __future__ import annotations

import asyncio
import binascii
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from collab.chat.shared.base import LiveView, OnQueued, ProcessStatus, SharedState
from collab.chat.shared.redis import RedisState

K = TypeVar("K")


def shard_index(name: str | int, count: int) -> int:
    """channels_redis.utils._consistent_hash: the same name gives the same server on the
    channel layer and here (tests/test_sharded.py holds them equal)."""
    if count == 1:
        return 0
    return int((binascii.crc32(str(name).encode()) & 0xFFF) / (4096 / count))


def split_urls(value: str) -> list[str]:
    """`REDIS_URL` or `COLLAB_SHARED_REDIS_URL`: one URL, or several separated by commas."""
    return [u.strip() for u in value.split(",") if u.strip()]


def _itself(item: int) -> int:
    return item


def _first(item: tuple[str | int, ...]) -> str | int:
    return item[0]


class ShardedState(SharedState):
    def __init__(self, urls: Sequence[str], prefix: str) -> None:
        self.urls = list(urls)
        self.shards = [RedisState(url, prefix) for url in self.urls]

    # --- routing ------------------------------------------------------------------------------

    def for_reply(self, reply_id: int) -> RedisState:
        return self.shards[shard_index(reply_id, len(self.shards))]

    def for_room(self, room_id: int) -> RedisState:
        return self.shards[shard_index(room_id, len(self.shards))]

    def _by_shard(self, items: Iterable[K], key: Callable[[K], str | int]) -> dict[int, list[K]]:
        """Items grouped by the server their `key` hashes to."""
        out: dict[int, list[K]] = {}
        for item in items:
            out.setdefault(shard_index(key(item), len(self.shards)), []).append(item)
        return out

    async def close(self) -> None:
        for shard in self.shards:
            await shard.close()

    # --- live replies ----------------------------------------------------------------------

    async def begin(self, reply_id: int, room_id: int, owner: str) -> None:
        await self.for_reply(reply_id).begin(reply_id, room_id, owner)

    async def append(self, reply_id: int, text: str, at_bytes: int, thinking: bool = False) -> None:
        await self.for_reply(reply_id).append(reply_id, text, at_bytes, thinking)

    async def append_and_publish(
        self, reply_id: int, text: str, at_bytes: int, channel: str, payload: bytes, thinking: bool = False
    ) -> bool:
        # The channel layer publishes `channel` on the server its name hashes to: one script
        # can do both only when that is the reply's server (broadcast checks the hosts agree).
        if shard_index(channel, len(self.shards)) != shard_index(reply_id, len(self.shards)):
            return False
        return await self.for_reply(reply_id).append_and_publish(reply_id, text, at_bytes, channel, payload, thinking)

    async def restore(self, reply_id: int, room_id: int, owner: str, text: str, state: str, thinking: str = "") -> None:
        await self.for_reply(reply_id).restore(reply_id, room_id, owner, text, state, thinking)

    async def set_state(self, reply_id: int, state: str) -> None:
        await self.for_reply(reply_id).set_state(reply_id, state)

    async def end(self, reply_id: int) -> None:
        await self.for_reply(reply_id).end(reply_id)

    async def read(self, reply_ids: Sequence[int]) -> dict[int, LiveView]:
        groups = self._by_shard(reply_ids, _itself)
        found = await asyncio.gather(*(self.shards[i].read(ids) for i, ids in groups.items()))
        return {k: v for part in found for k, v in part.items()}

    async def renew_leases(self, reply_ids: Iterable[int]) -> None:
        groups = self._by_shard(reply_ids, _itself)
        await asyncio.gather(*(self.shards[i].renew_leases(ids) for i, ids in groups.items()))

    async def expired_leases(self) -> list[int]:
        found = await asyncio.gather(*(shard.expired_leases() for shard in self.shards))
        return [i for part in found for i in part]

    async def leased(self, reply_ids: Sequence[int]) -> set[int]:
        groups = self._by_shard(reply_ids, _itself)
        found = await asyncio.gather(*(self.shards[i].leased(ids) for i, ids in groups.items()))
        return set().union(*found)

    async def uptime_s(self) -> float:
        # The youngest server: one that restarted lost its part of the leases and presence,
        # and callers (lifecycle) must treat the shared state as restarted.
        return min(await asyncio.gather(*(shard.uptime_s() for shard in self.shards)))

    # --- posting rate ----------------------------------------------------------------------

    async def take(self, key: str, burst: float, refill_s: float) -> bool:
        return await self.shards[shard_index(key, len(self.shards))].take(key, burst, refill_s)

    # --- presence ----------------------------------------------------------------------------

    async def join(self, room_id: int, user_id: int, socket: str) -> bool:
        return await self.for_room(room_id).join(room_id, user_id, socket)

    async def leave(self, room_id: int, user_id: int, socket: str) -> bool:
        return await self.for_room(room_id).leave(room_id, user_id, socket)

    async def renew_presence(self, sockets: Iterable[tuple[int, int, str]]) -> list[int]:
        groups = self._by_shard(sockets, _first)
        found = await asyncio.gather(*(self.shards[i].renew_presence(s) for i, s in groups.items()))
        return [room for part in found for room in part]

    async def online(self, room_id: int) -> set[int]:
        return await self.for_room(room_id).online(room_id)

    async def sweep_presence(self) -> list[int]:
        found = await asyncio.gather(*(shard.sweep_presence() for shard in self.shards))
        return [room for part in found for room in part]

    # --- a provider's deployment-wide concurrency cap ------------------------------------

    async def acquire_slot(self, name: str, cap: int, token: str, on_queued: OnQueued | None) -> None:
        await self.shards[shard_index(name, len(self.shards))].acquire_slot(name, cap, token, on_queued)

    async def release_slot(self, name: str, token: str) -> None:
        await self.shards[shard_index(name, len(self.shards))].release_slot(name, token)

    async def renew_slots(self, held: Iterable[tuple[str, str]]) -> None:
        groups = self._by_shard(held, _first)
        await asyncio.gather(*(self.shards[i].renew_slots(h) for i, h in groups.items()))

    # --- each process's status (the admin's live page): the first server's -------------------

    async def publish_status(self, process: str, status: str) -> None:
        await self.shards[0].publish_status(process, status)

    async def process_statuses(self) -> list[ProcessStatus]:
        return await self.shards[0].process_statuses()
