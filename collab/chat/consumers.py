"""The room's WebSocket: parse, authorise, call an action, send frames. Nothing else.

Frames from the channel layer are pre-rendered HTML; a member's only per-frame work
is a dict lookup and `send`. A socket's actions run one at a time, in the order sent,
in a task of their own, so the socket keeps forwarding frames meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from collab.chat import metrics, rendering
from collab.chat.actions import posting, replies, rooms, snapshot
from collab.chat.errors import ClientError
from collab.chat.events import MembershipEnded, RoomFrame, SessionEnded, room_group, user_group
from collab.chat.frames import parse_frame
from collab.chat.lifecycle import runtime

log = logging.getLogger(__name__)

CLOSE_FORBIDDEN = 4403  # WIRE.md: not allowed; the page does not retry
MAX_QUEUED_ACTIONS = 32  # a socket that sends faster than its actions run is told so


class RoomConsumer(AsyncWebsocketConsumer):
    room_id: int | None = None
    user_id: int | None = None

    async def connect(self) -> None:
        self.floors: dict[int, float] = {}
        self._inbox: asyncio.Queue[str | None] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        runtime.ensure_started()
        if runtime.draining:  # shutting down: refuse the handshake; the page retries (another process)
            await self.close()
            return
        user = self.scope.get("user")
        slug = self.scope["url_route"]["kwargs"]["slug"]
        found = await database_sync_to_async(rooms.room_for_socket)(user, slug)
        await self.accept()
        if found is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.room_id, room_slug = found
        self.user_id = user.pk  # type: ignore[union-attr]
        metrics.SOCKETS.inc()
        # Online before joining the group: the others are told, and this socket's own
        # member list (read below) already shows it.
        runtime.socket_opened(self.channel_name, self.room_id, self.user_id)
        try:
            await rooms.socket_opened(self.room_id, self.user_id, self.channel_name)
            # Join before reading the snapshot: every frame sent from now on is queued for
            # this socket, and `floors` drops the ones the snapshot already holds.
            await self.channel_layer.group_add(room_group(self.room_id), self.channel_name)
            await self.channel_layer.group_add(user_group(self.user_id), self.channel_name)
            messages_html, members_html, self.floors = await snapshot.snapshot(self.room_id, room_slug)
            await self.send(text_data=messages_html + members_html)
        except BaseException:  # Channels calls no disconnect() after a failed connect()
            await self.disconnect(1011)
            raise
        self._worker = asyncio.get_running_loop().create_task(self._work())

    async def disconnect(self, code: int) -> None:
        if self._worker is not None:
            self._inbox.put_nowait(None)  # actions already sent still run, then the worker ends
        if self.room_id is not None and self.user_id is not None and self.channel_name in runtime.sockets:
            metrics.SOCKETS.dec()
            runtime.socket_closed(self.channel_name)
            await self.channel_layer.group_discard(room_group(self.room_id), self.channel_name)
            await self.channel_layer.group_discard(user_group(self.user_id), self.channel_name)
            try:
                await rooms.socket_closed(self.room_id, self.user_id, self.channel_name)
            except Exception:  # presence then expires by itself (heartbeat)
                log.warning("could not mark a socket closed", exc_info=True)

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Frames touch no database: skip Channels' per-event aclose_old_connections()
        # (a thread hop per member per frame, docs/architecture.md).
        if message["type"] == "room.frame":
            await self.room_frame(message)  # type: ignore[arg-type]
        else:
            await super().dispatch(message)

    async def room_frame(self, event: RoomFrame) -> None:
        if event.get("by") == self.channel_name:
            return
        floors = self.floors
        if floors:
            msg = event.get("msg")
            if msg is not None and msg in floors:
                kind = event["kind"]
                if kind == "final":
                    del floors[msg]
                elif kind == "new" or event.get("offset", 0) < floors[msg]:
                    return
        await self.send(text_data=event["html"])

    async def session_ended(self, event: SessionEnded) -> None:
        session = self.scope.get("session")
        if session is not None and event["session_key"] == session.session_key:
            await self.send(text_data=rendering.frame_error("session.ended", "You have logged out."))
            await self.close(code=CLOSE_FORBIDDEN)

    async def membership_ended(self, event: MembershipEnded) -> None:
        if event["room_id"] == self.room_id:
            await self.send(text_data=rendering.frame_error("room.left", "You are no longer a member of this room."))
            await self.close(code=CLOSE_FORBIDDEN)

    # --- client actions -----------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.room_id is None or self.user_id is None:
            return
        if self._inbox.qsize() >= MAX_QUEUED_ACTIONS:
            await self.send(text_data=rendering.frame_error("frame.too_many", "Too many actions at once; slow down."))
            return
        self._inbox.put_nowait(text_data if text_data is not None else "")

    async def _work(self) -> None:
        """This socket's actions, one at a time, in the order they were sent."""
        while (text_data := await self._inbox.get()) is not None:
            runtime.action_started()
            try:
                await self._act(text_data)
            except ClientError as exc:
                await self._tell(rendering.frame_error(exc.code, exc.message))
            except Exception:
                log.exception("action failed in room %s", self.room_id)
                await self._tell(rendering.frame_error("server.error", "Something went wrong; try again."))
            finally:
                runtime.action_ended()

    async def _tell(self, html: str) -> None:
        try:
            await self.send(text_data=html)
        except Exception:  # the socket closed meanwhile
            log.debug("could not tell a closed socket", exc_info=True)

    async def _act(self, text_data: str) -> None:
        assert self.room_id is not None and self.user_id is not None
        action, content = parse_frame(text_data)
        if runtime.draining:
            raise ClientError("server.restarting", "The server is restarting; your page will reconnect.")
        if action == "post":
            result = await posting.post_message(
                self.user_id, self.room_id, content.get("text"), content.get("client_id")
            )
            for name in result.unknown_mentions:
                await self._tell(
                    rendering.frame_error(
                        "mention.unknown",
                        f"No assistant called @{name} is in this room; your message was posted as written.",
                    )
                )
        elif action == "stop":
            await replies.stop_reply(self.user_id, self.room_id, content.get("message_id"))
        elif action == "regenerate":
            await replies.regenerate_reply(self.user_id, self.room_id, content.get("message_id"))
