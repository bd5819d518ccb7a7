"""The only code that sends through the channel layer: to a room's sockets, to one
user's sockets, and to every server process (control).

Frames are rendered once by the caller (rendering.py) and sent as they are.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from collab.chat import metrics
from collab.chat.events import PROCESSES_GROUP, Control, RoomFrame, UserEvent, room_group, user_group


def _layer() -> Any:
    layer = get_channel_layer()
    assert layer is not None
    return layer


async def to_room(room_id: int, frame: RoomFrame) -> None:
    """One pre-rendered frame to every socket of a room, on every process."""
    metrics.FRAMES.labels(frame["kind"]).inc()
    await _layer().group_send(room_group(room_id), frame)


def to_room_sync(room_id: int, frame: RoomFrame) -> None:
    async_to_sync(to_room)(room_id, frame)


async def to_user(user_id: int, event: UserEvent) -> None:
    """An event to every socket of one user (closing them on removal, say)."""
    await _layer().group_send(user_group(user_id), event)


def to_user_sync(user_id: int, event: UserEvent) -> None:
    async_to_sync(to_user)(user_id, event)


async def to_processes(event: Control) -> None:
    """A control event to every server process (lifecycle's listener acts on it)."""
    await _layer().group_send(PROCESSES_GROUP, event)
