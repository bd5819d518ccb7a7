"""Logging a room's members in and keeping their WebSockets open.

:class:`RoomConnections` logs each member in over HTTP (or uses the session the seed step
wrote), opens one socket per member and tab (handshakes rationed per process: the
handshake gate), reads each socket in its own greenlet, handing every frame to
:class:`~collab.loadtest.room_replies.RoomReplies`, and reconnects a socket that closes.
"""

from __future__ import annotations

import time
from urllib.parse import quote

import gevent
import gevent.lock

from collab.loadtest import backoff
from collab.loadtest.client import LoginError, http_login
from collab.loadtest.config import ws_base
from collab.loadtest.room_replies import RoomReplies
from collab.loadtest.room_state import Conn
from collab.loadtest.wsclient import ConnectionClosed, HandshakeError, WebSocket

__all__ = ["RoomConnections"]

_MAX_RECONNECTS = 5  # outside a storm: a socket that keeps dropping is given up


_gate: gevent.lock.BoundedSemaphore | None = None


def _handshake_gate(size: int) -> gevent.lock.BoundedSemaphore:
    """The process's ration of WebSocket handshakes in progress."""
    global _gate
    if _gate is None:
        _gate = gevent.lock.BoundedSemaphore(max(1, size))
    return _gate


class RoomConnections(RoomReplies):
    """Logging in, connecting and reconnecting a room's members (a base of :class:`collab.loadtest.room.RoomRun`)."""

    # --- logging in and connecting -------------------------------------------------------

    def login(self) -> None:
        sessions: dict[str, str] = {}
        for i, u in enumerate(self.users):
            if u.get("session"):
                sessions[u["username"]] = u["session"]
                continue
            start = time.perf_counter()
            # With several server processes a member logs in on the next one and connects to
            # its own: a session must hold on every process (one secret key, one database).
            target = self.cfg.target_of(self.cfg.server_of(i + 1))
            try:
                sessions[u["username"]] = http_login(target, u["username"], u["password"])
                self.collector.count("logins")
                self._event("login", (time.perf_counter() - start) * 1000)
            except (OSError, LoginError) as exc:
                self.collector.error("login.failed")
                self._event("login", (time.perf_counter() - start) * 1000, exc=exc)
        for c in self.conns:
            c.session = sessions.get(c.username, "")

    def connect(self) -> int:
        """Open every member's socket; return how many got their snapshot in time."""
        for c in self.conns:
            if c.session:
                c.greenlet = gevent.spawn(self._reader, c)
        # Handshakes queue behind the process's gate: allow for the queue.
        cfg = self.cfg
        deadline = time.perf_counter() + cfg.connect_timeout_s + cfg.sockets * cfg.handshake_budget_s
        ok = 0
        for c in self.conns:
            if c.greenlet is not None and c.ready.wait(max(0.0, deadline - time.perf_counter())):
                ok += c.alive
        return ok

    def _open(self, c: Conn) -> WebSocket:
        target = self.cfg.target_of(c.server)
        url = f"{ws_base(target)}/ws/rooms/{quote(self.slug)}/"
        headers = {"Cookie": f"sessionid={c.session}", "Origin": self.cfg.origin or target}
        return WebSocket.connect(url, headers, timeout=self.cfg.connect_timeout_s)

    def _reader(self, c: Conn) -> None:
        while not self.stopping:
            # Handshakes are rationed per process, as browsers arriving over time would be:
            # a thousand at once only measure the server's accept queue.
            gate = _handshake_gate(self.cfg.connect_concurrency)
            gate.acquire()
            start = time.perf_counter()
            released = False
            try:
                ws = self._open(c)
            except (OSError, HandshakeError) as exc:
                gate.release()
                self.collector.error("ws.connect_failed")
                self.collector.count("close_refused")
                self._event("connect", (time.perf_counter() - start) * 1000, exc=exc)
                if not self._retry(c, None, ""):
                    return
                continue
            c.ws = ws
            try:
                while True:
                    messages = ws.recv_messages()
                    now = time.perf_counter()
                    for data in messages:
                        parsed = self._on_frame(c, data, now)
                        if not released and parsed.kind == "snapshot":
                            released = True
                            gate.release()
                            c.alive = True
                            c.retries = 0
                            if c.reconnects and self.go_wall:  # back after a drop (the storm's measure)
                                self.collector.add("storm_back_ms", (time.time() - self.go_wall) * 1000)
                                self.collector.add("storm_attempt_ms", (now - start) * 1000)
                                self.collector.count(f"storm_sec_{int(time.time())}")
                            ms = (now - start) * 1000
                            self.collector.add("connect_ms", ms)
                            self.collector.count("sockets")
                            self.collector.count(f"sockets_server_{c.server}")
                            self._live("sockets")
                            self._event("connect", ms)
                            c.ready.set()
                        elif parsed.kind == "snapshot" and self.go_wall:
                            # A fresh snapshot on an open socket: the server brought it up to
                            # date in place (after a Redis outage), no reconnect needed.
                            c.resynced = True
                            self.collector.add("storm_resync_ms", (time.time() - self.go_wall) * 1000)
            except ConnectionClosed as exc:
                if not released:
                    gate.release()
                if c.alive:
                    self._live("sockets", -1)
                c.alive = False
                if self.stopping:
                    return
                self.collector.count(f"close_{exc.code if exc.code is not None else 'none'}")
                if exc.code == 4403:
                    self.collector.error("ws.forbidden")
                    c.gave_up = True
                    c.ready.set()
                    return
                self.collector.error("ws.closed" if released else "ws.closed_before_snapshot")
                if not self.cfg.storm:  # a storm keeps each socket's replies to check them resume
                    self._drop_member(c)
                if not self._retry(c, exc.code, getattr(exc, "reason", "")):
                    return

    def _retry(self, c: Conn, code: int | None, reason: str) -> bool:
        """Wait as the page would (collab.loadtest.backoff), then say whether to try again."""
        c.reconnects += 1
        wait = backoff.delay_ms(code, reason, c.retries)
        c.retries += 1
        if wait is None or self.stopping or (not self.cfg.storm and c.reconnects > _MAX_RECONNECTS):
            c.gave_up = True
            c.ready.set()
            return False
        self.collector.count("reconnects")
        gevent.sleep(wait / 1000.0)
        return True

    def _drop_member(self, c: Conn) -> None:
        """A socket went away: its replies so far are judged now, the rest after reconnect."""
        for msg in list(self.pending_finals):
            self._member_done(msg, c.index)
