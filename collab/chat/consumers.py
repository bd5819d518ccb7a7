"""The room's WebSocket: on connect, the member's snapshot; then frames out, and each
action in, parsed and handed to the command registry (collab/chat/commands/). Nothing else.

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

from collab.chat import admission, broadcast, commands, fanout, metrics, rendering, socket_auth
from collab.chat.errors import ClientError
from collab.chat.events import (
    AccountChanged,
    MembershipEnded,
    RoomClosed,
    RoomFrame,
    SessionEnded,
    SocketResync,
    member_group,
    user_group,
)
from collab.chat.lifecycle import runtime
from collab.chat.outbox import CLOSE_TOO_SLOW, Outbox
from collab.chat.services import presence, sessions, snapshot, unread

log = logging.getLogger(__name__)

CLOSE_FORBIDDEN = 4403  # docs/wire.md: not allowed; the page does not retry
CLOSE_RETRY = 4503  # docs/wire.md: the server could not resync this socket; the page reconnects
MAX_QUEUED_ACTIONS = 32  # a socket that sends faster than its actions run is told so
# Why a membership ended -> the error code and sentence its sockets are shown (docs/wire.md).
ENDED = {
    "left": ("room.left", "You are no longer a member of this room."),
    "removed": ("room.removed", "You were removed from this room."),
    "banned": ("room.removed", "You were removed from this room and may not rejoin it."),
}


class RoomConsumer(AsyncWebsocketConsumer):
    room_id: int | None = None
    user_id: int | None = None
    # Staff who are not members: the room live, no action, and no presence (not "online").
    read_only = False
    outbox: Outbox
    # Made at the socket's first action: most sockets of a room at rest never send one.
    _worker: asyncio.Task[None] | None = None
    _inbox: asyncio.Queue[str | None]
    _expiry: asyncio.TimerHandle | None = None
    _session_watch: asyncio.Task[None] | None = None
    _gone = False
    # Frames that came while a snapshot was being made: handed on after it (None: none is).
    _held: list[tuple[RoomFrame, bytes | None]] | None = None
    _resync: asyncio.Task[None] | None = None
    _closing: asyncio.Task[None] | None = None
    # The user's rooms, their unread counts and mention marks: the page's sidebar (services/unread.py).
    sidebar: unread.Sidebar | None = None

    async def connect(self) -> None:
        # Per reply, the next offset this socket expects (inf: no more pieces, only its final).
        self.floors: dict[int, float] = {}
        self._snapshot_lock = asyncio.Lock()
        self._snapshots = 0  # snapshots asked for and not yet out (frames are held until none is)
        self.outbox = Outbox(self._send_now, self._too_slow)
        runtime.ensure_started()
        # Before any database or layer work: past this process's connect rate, or draining,
        # the page is told when to come back (collab/chat/admission.py, docs/wire.md 4429).
        hint = admission.refusal(runtime.draining)
        if hint is not None:
            await self.accept()
            await self.close(code=admission.CLOSE_COME_BACK_LATER, reason=admission.reason(hint))
            return
        slug = self.scope["url_route"]["kwargs"]["slug"]
        session = self.scope.get("session")
        found = await database_sync_to_async(socket_auth.admit)(session, slug) if session is not None else None
        await self.accept()
        if found is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.room_id, self.room_slug, self.read_only = found.room_id, found.slug, found.read_only
        self.user_id = found.user_id
        self.username: str = found.username  # a post's early guess (replies/early.py)
        self.auth_hash: str | None = found.auth_hash  # every action checks it against the account
        self.outbox.watch(self.base_send)
        metrics.SOCKETS.inc()
        # Online before joining the group: the others are told, and this socket's own
        # member list (read below) already shows it. A read-only (staff) socket is
        # nobody's presence: not in the member list, not renewed by the heartbeat; but it
        # is resynced after an outage like any other (runtime.watchers).
        runtime.socket_opened(self.channel_name, self.room_id, self.user_id, watcher=self.read_only)
        try:
            if not self.read_only:
                await presence.socket_opened(self.room_id, self.user_id, self.channel_name)
            await self._send_snapshot()
        except BaseException:  # Channels calls no disconnect() after a failed connect()
            await self.disconnect(1011)
            raise
        loop = asyncio.get_running_loop()
        left = found.session_left
        if left is not None and left > 0 and not self._gone:
            # Known from the connect (socket_auth.py): the timer alone. A task, even done,
            # is kept for the socket's life (docs/benchmarks/2026-12-06.md#b-issue-38).
            self._expiry = loop.call_later(min(left + 1, 30 * 86400), self._rewatch)
        else:
            self._session_watch = loop.create_task(self._watch_session(left))

    async def _send_snapshot(self) -> None:
        """Join the room's groups, then send its snapshot. Joining first: every frame sent
        from then on is held for this socket until the snapshot is out, and `floors` drops
        the ones the snapshot already holds (docs/architecture.md#a-reconnects). Joining
        is idempotent: a resync joins again, in case the layer lost its groups."""
        assert self.room_id is not None and self.user_id is not None
        if self._held is None:
            self._held = []
        self._snapshots += 1
        try:
            async with self._snapshot_lock:  # one at a time: the later one reads later
                await fanout.join(self.room_id, self)  # the room's frames (collab/chat/fanout.py)
                await broadcast.join(user_group(self.user_id), self.channel_name)
                await broadcast.join(member_group(self.room_id, self.user_id), self.channel_name)
                self.sidebar = self.sidebar or unread.Sidebar(self.channel_name)
                sidebar_html = await self.sidebar.follow(self.user_id, self.username, self.room_id)
                messages_html, members_html, self.floors = await snapshot.snapshot(
                    self.room_id, self.room_slug, self.user_id
                )
                await self.outbox.put(messages_html + members_html + sidebar_html)
        finally:
            self._snapshots -= 1
            if self._snapshots == 0:  # the last snapshot is out: what came meanwhile, on its floors
                held, self._held = self._held or [], None
                for event, data in held:
                    self.take_frame(event, data)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:  # also when the consumer died without disconnect() (the list layer's receive failed)
            self._forget()

    def _forget(self) -> bool:
        """This process's own record of the socket, dropped once; True the first time."""
        if self._gone:
            return False
        self._gone = True
        outbox = getattr(self, "outbox", None)  # none if the consumer failed before connect()
        if outbox is not None:
            outbox.close()
        if self.room_id is not None:
            fanout.leave(self.room_id, self)
        if self._resync is not None:
            self._resync.cancel()
        if self._expiry is not None:
            self._expiry.cancel()
        if self._session_watch is not None:
            self._session_watch.cancel()
        if self._worker is not None:
            self._inbox.put_nowait(None)  # actions already sent still run, then the worker ends
        if runtime.socket_closed(getattr(self, "channel_name", "")):
            metrics.SOCKETS.dec()
        return True

    async def disconnect(self, code: int) -> None:
        if self._forget() and self.room_id is not None and self.user_id is not None:
            try:
                await broadcast.leave(user_group(self.user_id), self.channel_name)
                await broadcast.leave(member_group(self.room_id, self.user_id), self.channel_name)
                if self.sidebar is not None:
                    await self.sidebar.unfollow()
                if not self.read_only:
                    await presence.socket_closed(self.room_id, self.user_id, self.channel_name)
            except Exception:  # the layer is away: groups and presence expire by themselves
                log.warning("could not mark a socket closed", exc_info=True)

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        # Frames queued for this socket (outbox.push) go out before its close frame.
        outbox = getattr(self, "outbox", None)  # none before connect() made it
        if outbox is not None:
            await outbox.flush()
        await super().close(code=code, reason=reason)

    async def _send_now(self, html: str) -> None:
        await self.send(text_data=html)

    async def _too_slow(self) -> None:
        log.warning("socket of user %s in room %s fell too far behind: closed", self.user_id, self.room_id)
        await self.close(code=CLOSE_TOO_SLOW)

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Frames touch no database: skip Channels' per-event aclose_old_connections()
        # (a thread hop per member per frame, docs/architecture.md#a-streaming-path).
        if message["type"] == "room.frame":
            self.take_frame(message, None)  # type: ignore[arg-type]
        elif message["type"] in unread.EVENTS:  # the sidebar's (services/unread.py): no database either
            html = self.sidebar.event(message) if self.sidebar is not None else None  # type: ignore[arg-type]
            if html is not None and not self.outbox.overflowed:
                self.outbox.push(html, None)
        elif message["type"] == "websocket.receive":
            # Nor for a member's action: it is only queued (`receive`), and its database work
            # goes through database_sync_to_async, which closes old connections itself. The
            # hop waited for the database thread before a post was even read, behind any
            # other reply's store (docs/architecture.md#a-early-requests).
            await self.websocket_receive(message)
        else:
            await super().dispatch(message)

    def take_frame(self, event: RoomFrame, data: bytes | None) -> None:
        """A frame for this socket: from the room's hub (collab/chat/fanout.py, `data` the
        frame's WebSocket bytes, made once for the room: wsbytes.py), or from its own
        channel (a personal reply's; `data` None). Sent now or queued, never awaited: the
        hub hands each frame to every socket in turn."""
        if self.outbox.overflowed:  # closing (too slow, or gone): nothing more
            return
        if self._held is not None:  # a snapshot is being made: after it
            self._held.append((event, data))
            if len(self._held) > self.outbox.max_frames:  # as a backlog that long would be (outbox.py)
                self._held.clear()
                self.outbox.close()
                self._closing = asyncio.get_running_loop().create_task(self._too_slow())
            return
        if event.get("by") == self.channel_name:
            return
        to = event.get("to")
        if to is not None and to != self.user_id:  # a personal reply: its recipient's alone (never sent here)
            return
        msg = event.get("msg")
        if msg is not None:
            floors = self.floors
            kind = event["kind"]
            if kind == "delta":
                floor = floors.get(msg)
                offset = event["offset"]
                if floor is not None:
                    if offset < floor:  # the snapshot already holds it
                        return
                    if offset > floor:  # a piece never reached this socket: start again from a snapshot
                        self._held = []  # this frame and the next wait for it
                        self._resync = asyncio.get_running_loop().create_task(self.room_resync({"type": "room.resync"}))
                        return
                    end = event.get("end")  # absent from a process of an earlier release: stop checking
                    if end is None:
                        del floors[msg]
                    else:
                        floors[msg] = end
            elif kind == "final":
                floors.pop(msg, None)
                floors.pop(-msg, None)  # its thinking's floor (a thinking piece's msg is -N)
                resume = event.get("resume")
                if resume is not None:  # streaming again (continue): pieces follow from there
                    floors[msg], floors[-msg] = resume
            elif kind == "new":
                if msg in floors:  # the snapshot already holds it
                    return
                for reply_id in event.get("replies", ()):
                    floors[reply_id] = 0
                    floors[-reply_id] = 0  # its thinking, if any
        elif event.get("not_user") == self.user_id:  # "NAME is typing": not to NAME's own sockets
            return
        self.outbox.push(event["html"], data)

    async def room_resync(self, event: SocketResync) -> None:
        """Frames were lost (the layer was away, or a piece skipped): the snapshot again.
        Frames that come meanwhile are held and handed on after it."""
        if self.room_id is None or self.outbox.overflowed:
            self._held = None  # (a socket that overflowed is being closed)
            return
        metrics.SOCKETS_RESYNCED.inc()
        try:
            await self._send_snapshot()
        except Exception:  # still away: close with 4503, and the page reconnects (collab.js)
            log.warning("could not resync a socket; closing it", exc_info=True)
            await self.close(code=CLOSE_RETRY)

    async def _watch_session(self, left: float | None = None) -> None:
        """Close this socket when its session expires (unless it was renewed meanwhile).
        `left`: as the connect read it (socket_auth.py); else read now."""
        session = self.scope.get("session")
        key = session.session_key if session is not None else None
        loop = asyncio.get_running_loop()
        if left is None:
            try:
                left = await database_sync_to_async(sessions.session_seconds_left)(key)
            except Exception:  # the database is away: ask again in a minute
                log.warning("could not read when a socket's session expires", exc_info=True)
                left = 60.0 if not self._gone else None
        if left is None or self._gone:
            return
        if left <= 0:
            await self._tell(rendering.frame_error("session.ended", "Your session has expired; log in again."))
            await self.close(code=CLOSE_FORBIDDEN)
            return
        # call_later takes at most ~49 days; a session renewed meanwhile is checked again then.
        self._expiry = loop.call_later(min(left + 1, 30 * 86400), self._rewatch)

    def _rewatch(self) -> None:
        if not self._gone:
            self._session_watch = asyncio.get_running_loop().create_task(self._watch_session())

    async def session_ended(self, event: SessionEnded) -> None:
        session = self.scope.get("session")
        if session is not None and event["session_key"] == session.session_key:
            await self._tell(rendering.frame_error("session.ended", "You have logged out."))
            await self.close(code=CLOSE_FORBIDDEN)

    async def account_changed(self, event: AccountChanged) -> None:
        """The user was deactivated or deleted, or their password changed: this socket's
        session no longer holds, unless it is the one that changed the password (Django
        keeps that session's hash current: update_session_auth_hash)."""
        assert self.user_id is not None
        session = self.scope.get("session")
        key = session.session_key if session is not None else None
        refusal, self.auth_hash = await database_sync_to_async(sessions.socket_refusal)(
            self.user_id, key, self.auth_hash
        )
        if refusal is not None:
            await self._tell(rendering.frame_error("session.ended", refusal))
            await self.close(code=CLOSE_FORBIDDEN)

    async def membership_ended(self, event: MembershipEnded) -> None:
        html = self.sidebar.forget(event["room_id"]) if self.sidebar is not None else None
        if html is not None and event["room_id"] != self.room_id:
            await self._tell(html)
        if event["room_id"] == self.room_id:
            code, text = ENDED.get(event["reason"], ENDED["left"])
            await self._tell(rendering.frame_error(code, text))
            await self.close(code=CLOSE_FORBIDDEN)

    async def room_closed(self, event: RoomClosed) -> None:
        if event["room_id"] == self.room_id:
            why = f" ({event['reason']})" if event.get("reason") else ""
            await self._tell(rendering.frame_error("room.closed", f"This room was closed by its staff{why}."))
            await self.close(code=CLOSE_FORBIDDEN)

    # --- client actions -----------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.room_id is None or self.user_id is None:
            return
        if self._worker is None:
            if self._gone:
                return
            self._inbox = asyncio.Queue()
            self._worker = asyncio.get_running_loop().create_task(self._work())
        if self._inbox.qsize() >= MAX_QUEUED_ACTIONS:
            await self._tell(rendering.frame_error("frame.too_many", "Too many actions at once; slow down."))
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
                if exc.code == "session.ended":  # the account changed under this socket: it is done
                    await self.close(code=CLOSE_FORBIDDEN)
            except Exception:
                log.exception("action failed in room %s", self.room_id)
                await self._tell(rendering.frame_error("server.error", "Something went wrong; try again."))
            finally:
                runtime.action_ended()

    async def _tell(self, html: str) -> None:
        try:
            await self.outbox.put(html)
        except Exception:  # the socket closed meanwhile
            log.debug("could not tell a closed socket", exc_info=True)

    def _address(self) -> str | None:
        """Where this socket connects from (the audit log's address)."""
        client = self.scope.get("client")
        return str(client[0]) if client else None

    async def _act(self, text_data: str) -> None:
        assert self.room_id is not None and self.user_id is not None
        if self.read_only:  # checked before anything else: nothing from this socket is acted on
            raise ClientError("room.read_only", "You are viewing this room as staff, read-only: join it to take part.")
        action, fields = commands.parse_action(text_data)
        if runtime.draining:
            raise ClientError("server.restarting", "The server is restarting; your page will reconnect.")
        socket = commands.Socket(
            self.user_id, self.room_id, self.username, self.channel_name, self._address(), self._tell, self.auth_hash
        )
        await commands.dispatch(socket, action, fields)
