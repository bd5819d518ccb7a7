"""What one room run holds: its members' sockets, their view of each reply, the posts.

:class:`Conn` is one member's socket (a member may have several: tabs), :class:`MemberReply`
what one socket has of one reply, :class:`Post` one prompt posted. :class:`RoomState` sets
up a room's run (the members, their sockets, what is in flight) and reports to Locust; it is
the base of :class:`collab.loadtest.room.RoomRun`, which the other ``room_*`` modules build
up: :mod:`.room_replies` (reading frames, checking and timing replies) and
:mod:`.room_connections` (logging in, connecting, reconnecting).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gevent
import gevent.event

from collab.loadtest.agents import AgentWatch
from collab.loadtest.config import RunConfig
from collab.loadtest.files import FileUploads
from collab.loadtest.stats import Collector
from collab.loadtest.wire import Parsed
from collab.loadtest.wsclient import WebSocket

__all__ = ["Conn", "Fire", "MemberReply", "Post", "RoomState"]

Fire = Callable[..., None]  # Locust's events.request.fire


@dataclass(slots=True)
class MemberReply:
    """One member's view of one reply."""

    have: int = 0  # characters received contiguously
    parts: list[str] = field(default_factory=list)
    times: list[tuple[int, int, float]] = field(default_factory=list)  # (offset, end, arrival)
    ahead: dict[int, Any] = field(default_factory=dict)  # pieces past a gap, by offset
    first_at: float | None = None
    final_at: float | None = None
    status: str = ""
    joined_late: bool = False  # connected mid-reply: its first piece is not a first token
    duplicated: int = 0  # characters received twice
    out_of_order: int = 0  # characters of pieces that came before a piece they follow


@dataclass
class Post:
    nonce: str
    at: float
    poster: int
    mentions: int
    replies: list[int] = field(default_factory=list)
    answered: bool = False


class Conn:
    """One WebSocket of one member (a member may have several: tabs)."""

    def __init__(self, index: int, username: str, server: int = 0) -> None:
        self.index = index
        self.username = username
        self.server = server  # which of the config's targets it connects to
        self.session = ""
        self.ws: WebSocket | None = None
        self.replies: dict[int, MemberReply] = {}
        self.ready = gevent.event.Event()
        self.alive = False
        self.reconnects = 0
        self.retries = 0  # consecutive failed attempts (the back-off's exponent)
        self.resynced = False  # got a fresh snapshot without reconnecting (storm)
        self.gave_up = False  # no more attempts (4403, or too many drops outside a storm)
        self.greenlet: gevent.Greenlet | None = None
        # (sent, shown): when each of its posts left and when its own "new" frame came back
        self.posting: list[tuple[float, float]] = []


class RoomState:
    """One room's run: its members, their sockets and what is in flight (see :class:`collab.loadtest.room.RoomRun`)."""

    def __init__(
        self,
        cfg: RunConfig,
        room: dict[str, Any],
        collector: Collector,
        fire: Fire | None = None,
        live: dict[str, int] | None = None,
    ) -> None:
        self.cfg = cfg
        self.slug: str = room["slug"]
        self.users: list[dict[str, str]] = list(room["users"])
        self.assistants: list[str] = list(room.get("assistants", []))
        self.collector = collector
        self.fire = fire
        self.live = live if live is not None else {}
        self.rng = random.Random(f"{cfg.seed}:{self.slug}")
        self.conns: list[Conn] = []
        # Member i connects to server process i mod N (its tabs too), so a room spans them
        # all; or, route "hash", every member to the room's one process (config.RunConfig).
        for i, u in enumerate(self.users):
            for _ in range(max(1, cfg.sockets_per_member)):
                self.conns.append(Conn(len(self.conns), u["username"], cfg.server_of(i, self.slug)))
        self.cache: dict[bytes, Parsed] = {}
        self.posts: dict[str, Post] = {}
        self.reply_post: dict[int, Post] = {}
        self.pending_finals: dict[int, set[int]] = {}
        self.in_flight: set[int] = set()
        self.stopping = False
        self.window = (float("inf"), float("inf"))  # posting phase, perf_counter clock
        self.storm_post = bool(room.get("storm_post"))  # storm: this room streams a reply at the restart
        self.go_wall = 0.0  # when posting began, wall clock (the storm's times are from it)
        self._canon: dict[int, tuple[str, bool]] = {}
        self._final_frames: dict[int, Parsed] = {}
        self._mention_text = " ".join("@" + a for a in self.assistants[: max(0, cfg.mentions)])
        self.agents = AgentWatch(collector, cfg.agent_script, cfg.tps, cfg.tick_ms) if cfg.agent_script else None
        self.files = FileUploads(collector, cfg.file_share, cfg.seed) if cfg.file_share > 0 else None

    # --- Locust reporting ----------------------------------------------------------------

    def _event(self, name: str, ms: float, length: int = 0, exc: Exception | None = None) -> None:
        if self.fire is not None:
            self.fire(
                request_type="WS",
                name=name,
                response_time=ms,
                response_length=length,
                exception=exc,
                context={"room": self.slug},
            )

    def _live(self, key: str, n: int = 1) -> None:
        self.live[key] = self.live.get(key, 0) + n
