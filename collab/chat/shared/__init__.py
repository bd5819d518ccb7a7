"""State shared by every server process of a deployment: the live replies (text so far,
state, owner lease), posting rate limits, presence and providers' deployment-wide
concurrency caps.

With Redis (`REDIS_URL`) the state lives there and any process can read or change it;
with several Redis URLs (comma separated) it is sharded over them (sharded.py); without,
one process is the deployment and the same interface is kept in memory.
`backend()` returns the one for the running event loop.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import weakref
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError

from collab.chat.shared.base import LiveView, ReplyEnded, SharedState, StateLost
from collab.chat.shared.memory import MemoryState

__all__ = [
    "PROCESS_ID",
    "UNAVAILABLE",
    "LiveView",
    "ReplyEnded",
    "SharedState",
    "StateLost",
    "backend",
    "online_sync",
    "reset",
    "reset_memory",
]

# What a call to the shared state raises while it is unreachable (Redis away).
UNAVAILABLE: tuple[type[BaseException], ...] = (ConnectionError, OSError, TimeoutError, RedisError)

# This process, as leases and presence name it: unique across machines and restarts.
PROCESS_ID = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"

_memory = MemoryState()
_redis: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], SharedState]] = (
    weakref.WeakKeyDictionary()
)


def backend() -> SharedState:
    """Redis when `COLLAB_SHARED_REDIS_URL` (default: `REDIS_URL`) is set, sharded when it
    lists several URLs, else this process's memory. Redis clients are per event loop
    (their connections belong to it)."""
    url = settings.COLLAB_SHARED_REDIS_URL
    if not url:
        return _memory
    from collab.chat.shared.redis import RedisState
    from collab.chat.shared.sharded import ShardedState, split_urls

    loop = asyncio.get_running_loop()
    per_loop = _redis.setdefault(loop, {})
    key = (url, settings.COLLAB_REDIS_PREFIX)
    state = per_loop.get(key)
    if state is None:
        urls = split_urls(url)
        prefix = settings.COLLAB_REDIS_PREFIX
        state = per_loop[key] = RedisState(urls[0], prefix) if len(urls) == 1 else ShardedState(urls, prefix)
    return state


def reset_memory() -> None:
    """Forget this process's memory state (tests)."""
    _memory.__init__()  # type: ignore[misc]


async def reset() -> None:
    """Forget everything (tests): the memory state, and close this loop's Redis clients."""
    reset_memory()
    per_loop = _redis.pop(asyncio.get_running_loop(), {})
    for state in per_loop.values():
        await state.close()


_sync_clients: dict[str, Any] = {}


def online_sync(room_id: int) -> set[int]:
    """`online(room_id)` for sync code (views, on_commit hooks), which has no event loop
    of its own to keep an async client on."""
    url = settings.COLLAB_SHARED_REDIS_URL
    if not url:
        return set(_memory._sockets.get(room_id, {}).values())
    import redis

    from collab.chat.shared.redis import ONLINE, user_ids
    from collab.chat.shared.sharded import shard_index, split_urls

    urls = split_urls(url)
    url = urls[shard_index(room_id, len(urls))]  # the room's server (sharded.py)
    script = _sync_clients.get(url)
    if script is None:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
        script = _sync_clients[url] = client.register_script(ONLINE)
    return user_ids(script(keys=[f"{settings.COLLAB_REDIS_PREFIX}pr:{room_id}"]))
