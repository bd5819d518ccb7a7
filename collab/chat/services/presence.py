"""Who has a room open (docs/wire.md, the member list): kept in the shared state by every
process (a member is online while any socket of theirs, on any process, is open), and
told to the room as changes, at most one frame per room every `PRESENCE_MS`.

Announcing the whole list on every connect cost a room of N members reconnecting at once
N lists of N entries each, every one a database read and a render
(docs/architecture.md#a-connects). Here a process notes whose presence changed, and once
per interval per room sends one frame with an entry for each of them, as the shared
state has them then. A room listed in part (more members than MEMBERS_LISTED, online
first) gets its whole list instead, debounced the same: a change there can reorder what
is shown.
"""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from django.conf import settings

from collab.chat import broadcast, frames, rendering, room_frames, shared
from collab.chat.services import snapshot_cache
from collab.chat.services.rooms import member_rows, members_with

log = logging.getLogger(__name__)

_changed: dict[int, set[int]] = {}  # room -> users whose presence this process changed, not yet told
_timers: dict[int, asyncio.Task[None]] = {}


async def socket_opened(room_id: int, user_id: int, socket: str) -> None:
    if await shared.backend().join(room_id, user_id, socket):
        changed(room_id, user_id)


async def socket_closed(room_id: int, user_id: int, socket: str) -> None:
    if await shared.backend().leave(room_id, user_id, socket):
        changed(room_id, user_id)


def changed(room_id: int, user_id: int) -> None:
    """The user came or went: the room is told within PRESENCE_MS, with whoever else did."""
    _changed.setdefault(room_id, set()).add(user_id)
    if room_id not in _timers:
        task = asyncio.get_running_loop().create_task(_later(room_id))
        _timers[room_id] = task


async def _later(room_id: int) -> None:
    try:
        await asyncio.sleep(settings.COLLAB["PRESENCE_MS"] / 1000)  # the debounce interval itself
    finally:
        _timers.pop(room_id, None)
    await _tell(room_id)


async def _tell(room_id: int) -> None:
    users = _changed.pop(room_id, set())
    if not users:
        return
    try:
        online = await shared.backend().online(room_id)
        room = snapshot_cache.current(room_id)  # the members as the snapshots have them, if kept
        rows = room.members if room is not None else await database_sync_to_async(member_rows)(room_id)
        members = members_with(rows, online)
        if len(members) > rendering.budget("MEMBERS_LISTED"):
            html = room_frames.frame_members(members)
        else:  # (a user who is no longer a member is in no list: nothing to tell of them)
            html = room_frames.frame_presence([m for m in members if m["user_id"] in users])
        if html:
            await broadcast.to_room(room_id, frames.other(html, ephemeral=True))
    except Exception:  # the layer or the database is away: the next snapshot shows who is online
        log.warning("could not tell room %s who came and went", room_id, exc_info=True)


async def flush() -> None:
    """Tell every room now what is pending (a process that stops: its sockets' goodbyes)."""
    for task in list(_timers.values()):
        task.cancel()
    _timers.clear()
    for room_id in list(_changed):
        await _tell(room_id)
