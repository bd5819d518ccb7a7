"""The room's WebSocket: parse, authorise, call a service, send frames. Nothing else.

Frames from the channel layer are pre-rendered HTML; a member's only per-frame work
is a dict lookup and `send`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from collab.chat import metrics, rendering, services
from collab.chat.events import MembershipEnded, RoomFrame, room_group, user_group
from collab.chat.services import ClientError

log = logging.getLogger(__name__)

CLOSE_FORBIDDEN = 4403  # WIRE.md: not allowed; the page does not retry


class RoomConsumer(AsyncWebsocketConsumer):
    room_id: int | None = None
    user_id: int | None = None

    async def connect(self) -> None:
        self.floors: dict[int, float] = {}
        self._actions: set[asyncio.Task[None]] = set()
        user = self.scope.get("user")
        slug = self.scope["url_route"]["kwargs"]["slug"]
        found = await database_sync_to_async(services.room_for_socket)(user, slug)
        await self.accept()
        if found is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.room_id, room_slug = found
        self.user_id = user.pk  # type: ignore[union-attr]
        # Join before reading the snapshot: every frame sent from now on is queued for
        # this socket, and `floors` drops the ones the snapshot already holds.
        await self.channel_layer.group_add(room_group(self.room_id), self.channel_name)
        await self.channel_layer.group_add(user_group(self.user_id), self.channel_name)
        messages_html, members_html, self.floors = await services.snapshot(self.room_id, room_slug)
        await self.send(text_data=messages_html + members_html)
        metrics.SOCKETS.inc()

    async def disconnect(self, code: int) -> None:
        if self.room_id is not None and self.user_id is not None:
            metrics.SOCKETS.dec()
            await self.channel_layer.group_discard(room_group(self.room_id), self.channel_name)
            await self.channel_layer.group_discard(user_group(self.user_id), self.channel_name)

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Frames touch no database: skip Channels' per-event aclose_old_connections()
        # (a thread hop per member per frame, ARCHITECTURE.md "facts").
        if message["type"] == "room.frame":
            await self.room_frame(message)  # type: ignore[arg-type]
        else:
            await super().dispatch(message)

    async def room_frame(self, event: RoomFrame) -> None:
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

    async def membership_ended(self, event: MembershipEnded) -> None:
        if event["room_id"] == self.room_id:
            await self.send(text_data=rendering.frame_error("room.left", "You are no longer a member of this room."))
            await self.close(code=CLOSE_FORBIDDEN)

    # --- client actions -----------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.room_id is None or self.user_id is None:
            return
        # As a task: a post waits on the database for tens of ms, and this consumer must
        # keep forwarding frames meanwhile (Channels handles one event at a time). Actions
        # of one socket still run in order: they queue on the database thread, FIFO.
        task = asyncio.get_running_loop().create_task(self._run_action(text_data))
        self._actions.add(task)
        task.add_done_callback(self._actions.discard)

    async def _run_action(self, text_data: str | None) -> None:
        try:
            await self._act(text_data)
        except ClientError as exc:
            await self.send(text_data=rendering.frame_error(exc.code, exc.message))
        except Exception:
            log.exception("action failed in room %s", self.room_id)
            await self.send(text_data=rendering.frame_error("server.error", "Something went wrong; try again."))

    async def _act(self, text_data: str | None) -> None:
        assert self.room_id is not None and self.user_id is not None
        if text_data is None:
            raise ClientError("frame.malformed", "Send JSON text frames.")
        if len(text_data) > settings.COLLAB["MAX_FRAME_BYTES"]:
            raise ClientError("frame.too_large", "That frame is too large.")
        try:
            content = json.loads(text_data)
        except ValueError:
            raise ClientError("frame.malformed", "That frame is not valid JSON.") from None
        if not isinstance(content, dict):
            raise ClientError("frame.malformed", "A frame is a JSON object.")
        action = content.get("action") or "post"
        if action == "post":
            result = await services.post_message(
                self.user_id, self.room_id, content.get("text"), content.get("client_id")
            )
            for name in result.unknown_mentions:
                await self.send(
                    text_data=rendering.frame_error(
                        "mention.unknown",
                        f"No assistant called @{name} is in this room; your message was posted as written.",
                    )
                )
        elif action == "stop":
            await services.stop_reply(self.user_id, self.room_id, content.get("message_id"))
        elif action == "regenerate":
            await services.regenerate_reply(self.user_id, self.room_id, content.get("message_id"))
        else:
            raise ClientError("action.unknown", f"Unknown action {str(action)[:40]!r}.")
