"""The only code that sends through the channel layer: to a room's sockets, to one
user's sockets, to one socket or process channel, and to every server process
(control); and the only code that joins and leaves its groups.

Frames are built by their constructors (frames.py) with HTML rendered once by the
caller (rendering.py), and sent as they are. A change made in a transaction is sent
once it has committed (`after_commit`): never a frame for a write that rolled back.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

from collab.chat import metrics, shared
from collab.chat.events import (
    PROCESSES_GROUP,
    Control,
    RoomClosed,
    RoomFrame,
    UnreadActivity,
    UserEvent,
    activity_group,
    member_group,
    room_group,
    user_group,
)
from collab.chat.shared.sharded import shard_index, split_urls

log = logging.getLogger(__name__)
_warned = False  # _pubsub_target fell back (said once)


def _layer() -> Any:
    layer = get_channel_layer()
    assert layer is not None
    return layer


def _group(room_id: int, frame: RoomFrame) -> str:
    """The room's group; a personal reply's frames (`to`: its recipient) go to the
    recipient's own sockets in the room only (docs/architecture.md#a-personal-replies)."""
    to = frame.get("to")
    return room_group(room_id) if to is None else member_group(room_id, to)


async def to_room(room_id: int, frame: RoomFrame) -> None:
    """One pre-rendered frame to every socket of a room (or, with `to`, of one of its
    members), on every process."""
    metrics.FRAMES.labels(frame["kind"]).inc()
    await _layer().group_send(_group(room_id, frame), frame)


async def piece_to_room(
    room_id: int, reply_id: int, text: str, at_bytes: int, frame: RoomFrame, thinking: bool = False
) -> None:
    """A reply's piece: recorded in the shared state (its text so far), then sent to the
    room, in that order (docs/architecture.md#a-reconnects). On the Redis pub/sub layer
    with the shared state in the same Redis, both happen in one command: the channel
    layer's own message, published by a script that first appends the text."""
    metrics.FRAMES.labels(frame["kind"]).inc()
    state = shared.backend()
    group = _group(room_id, frame)
    target = _pubsub_target(group)
    if target is not None and await state.append_and_publish(
        reply_id, text, at_bytes, target[0], target[1](frame), thinking
    ):
        return
    await state.append(reply_id, text, at_bytes, thinking)
    await _layer().group_send(group, frame)


@functools.lru_cache(maxsize=4)
def _server_count(url: str) -> int:
    """How many Redis servers `REDIS_URL` names (read per piece: split once)."""
    return len(split_urls(url))


def _pubsub_target(group: str) -> tuple[str, Any] | None:
    """(the group's Redis channel, the layer's serializer) when one script may publish
    for the channel layer: channels_redis's pub/sub layer on the shared state's Redis
    servers, the same list in the same order (sharded, the shared state still declines
    a channel that is not on its reply's server). Else None (in-memory layer, list-based
    layer, other Redis servers)."""
    if not settings.COLLAB_SHARED_REDIS_URL or settings.COLLAB_SHARED_REDIS_URL != settings.REDIS_URL:
        return None
    layer = _layer()
    try:
        from channels_redis.pubsub import RedisPubSubChannelLayer

        if not isinstance(layer, RedisPubSubChannelLayer):
            return None
        loop_layer = layer._get_layer()
        if len(loop_layer._shards) != _server_count(settings.REDIS_URL):
            return None
        return loop_layer._get_group_channel_name(group), layer.serialize
    except (ImportError, AttributeError):  # channels_redis changed: the two-step path still works
        global _warned
        if not _warned:  # once, not once per piece
            _warned = True
            log.warning("channels_redis internals moved: pieces take two Redis commands", exc_info=True)
        return None


def after_commit(room_id: int, frame: RoomFrame | RoomClosed) -> None:
    """Send `frame` to the room once the current transaction commits (at once outside one).
    Robust: the change is stored whatever the channel layer does; its pages converge at
    their next snapshot (a failure is logged, not raised)."""
    transaction.on_commit(lambda: to_room_sync(room_id, frame), robust=True)


def after_commit_with(room_id: int, make: Callable[[], RoomFrame]) -> None:
    """As `after_commit`, the frame made once the transaction has committed (what it
    shows is read then: the member list as the change left it)."""
    transaction.on_commit(lambda: to_room_sync(room_id, make()), robust=True)


def to_user_after_commit(user_id: int, event: UserEvent) -> None:
    transaction.on_commit(lambda: to_user_sync(user_id, event), robust=True)


def to_room_sync(room_id: int, frame: RoomFrame | RoomClosed) -> None:
    if frame["type"] == "room.frame":
        async_to_sync(to_room)(room_id, frame)
    else:  # an event for the room's consumers, not a frame (closing the room)
        async_to_sync(_layer().group_send)(room_group(room_id), frame)


async def to_user(user_id: int, event: UserEvent) -> None:
    """An event to every socket of one user (closing them on removal, say)."""
    await _layer().group_send(user_group(user_id), event)


def to_user_sync(user_id: int, event: UserEvent) -> None:
    async_to_sync(to_user)(user_id, event)


async def to_processes(event: Control) -> None:
    """A control event to every server process (lifecycle's listener acts on it)."""
    await _layer().group_send(PROCESSES_GROUP, event)


def server_groups(name: str) -> list[str]:
    """One group per Redis server of a sharded channel layer, each on its own server
    (`{name}.{k}`, k chosen by channels_redis's hash: of the group's channel on the
    pub/sub layer, of the group's name on the list one); [] with one server or none.
    A message through each of them proves every server delivers again: the process's
    own ping does not otherwise cross them all (docs/architecture.md#a-sharding)."""
    urls = split_urls(settings.REDIS_URL)
    if len(urls) < 2:
        return []
    config = settings.CHANNEL_LAYERS["default"]
    pubsub = str(config["BACKEND"]).endswith("RedisPubSubChannelLayer")
    prefix = config.get("CONFIG", {}).get("prefix", "asgi")
    base = re.sub(r"[^\w.-]", "-", name)[:80]  # a group's name: letters, digits, - _ . only
    found: dict[int, str] = {}
    k = 0
    while len(found) < len(urls):
        group = f"{base}.{k}"
        found.setdefault(shard_index(f"{prefix}__group__{group}" if pubsub else group, len(urls)), group)
        k += 1
    return [found[i] for i in range(len(urls))]


async def to_group(group: str, event: dict[str, Any]) -> None:
    """An event to every channel of a group (a process's own pings: `server_groups`)."""
    await _layer().group_send(group, event)


async def to_channel(channel: str, event: dict[str, Any]) -> None:
    """An event to one channel: a socket's own (a resync), or a process's (its ping)."""
    await _layer().send(channel, event)


async def join(group: str, channel: str) -> None:
    """From now on, what is sent to `group` reaches `channel` (idempotent)."""
    await _layer().group_add(group, channel)


async def leave(group: str, channel: str) -> None:
    await _layer().group_discard(group, channel)


async def to_room_activity(event: UnreadActivity) -> None:
    """A room's new messages, in one small event, to the sockets of all its members
    wherever they are (their sidebars: services/unread.py). Once per post, not per piece."""
    await _layer().group_send(activity_group(event["room_id"]), event)
