"""One room's members, as the load generator plays them (gevent; only Locust imports this).

A :class:`RoomRun` logs its members in over HTTP (or uses the sessions the seed step
wrote), opens one WebSocket per member and tab, posts prompts that @mention the room's
assistants with Poisson arrivals, reads every frame at every member, checks every reply
(contiguous offsets, final text equal to the pieces) and measures it. All the members of
a room live in one process, one greenlet each, so the spread of one piece's arrival
across them (skew) is measured on one clock.

The parts, by topic: :mod:`collab.loadtest.room_state` (what a run holds: sockets,
replies, posts), :mod:`collab.loadtest.room_replies` (reading frames, checking and timing
each reply: how a piece's emission time is estimated is there) and
:mod:`collab.loadtest.room_connections` (logging in, handshakes, reconnecting); this
module posts and runs the room.
"""

from __future__ import annotations

import json
import logging
import time
import uuid

import gevent

from collab.loadtest.agents import post_in_turn
from collab.loadtest.room_connections import RoomConnections
from collab.loadtest.room_state import Conn, Post
from collab.loadtest.wsclient import ConnectionClosed

__all__ = ["Post", "RoomRun"]

log = logging.getLogger("collab.loadtest")

_QUESTIONS = (
    "how would you stream tokens to many people at once",
    "what makes a chat server slow under load",
    "explain back pressure in a websocket fan-out",
    "compare two ways to batch small messages",
    "how do you measure latency percentiles honestly",
)


class RoomRun(RoomConnections):
    """Play one room: log in, connect, post, read, check and measure; then report."""

    # --- posting -------------------------------------------------------------------------

    def post(self, index: int) -> None:
        c = self.conns[index % len(self.conns)]
        if c.ws is None or not c.alive:
            self.collector.error("post.no_socket")
            return
        if self.files is not None and self.files.wants_file():
            # Uploaded first, as the page does; in its own greenlet, so that the Poisson
            # arrivals of the other posts keep their schedule.
            gevent.spawn(self._post_with_file, c)
            return
        self._send_post(c)

    def _post_with_file(self, c: Conn) -> None:
        assert self.files is not None
        file_id = self.files.upload(self.cfg.target_of(c.server), self.slug, c.session)
        if file_id is not None and c.ws is not None and c.alive and not self.stopping:
            self._send_post(c, [file_id])

    def _send_post(self, c: Conn, files: list[int] | None = None) -> None:
        ws = c.ws
        if ws is None:
            self.collector.error("post.no_socket")
            return
        nonce = "lt" + uuid.uuid4().hex[:16]
        question = self.rng.choice(_QUESTIONS)
        text = f"{self._mention_text} {nonce} {question}?".strip()
        if self.agents is not None:
            text = self.agents.prompt(self._mention_text, nonce)
        fields: dict[str, object] = {"text": text, "client_id": str(uuid.uuid4())}
        if files:
            fields["files"] = files
        frame = json.dumps(fields)
        post = Post(nonce, time.perf_counter(), c.index, self.cfg.mentions)
        self.posts[nonce] = post
        try:
            ws.send_text(frame)
        except (OSError, ConnectionClosed):
            del self.posts[nonce]
            self.collector.error("post.send_failed")
            return
        self.collector.count("posts")
        self._live("posts")

    def run(self, go_at: float) -> None:
        """Post with Poisson arrivals from ``go_at`` (perf_counter) for the configured time."""
        cfg = self.cfg
        self.window = (go_at, go_at + cfg.duration_s)
        gevent.sleep(max(0.0, go_at - time.perf_counter()))
        if cfg.storm:  # some rooms ask for one long reply, streaming when the server restarts
            if self.assistants and self.storm_post:
                self.post(0)
        elif cfg.runs > 0 and self.assistants:  # that many posts, each after the last reply ended
            post_in_turn(cfg.runs, self.post, self._busy, go_at + cfg.duration_s + cfg.drain_s)
        elif cfg.post_rate > 0 and self.assistants and cfg.mentions > 0:
            at = go_at + self.rng.expovariate(cfg.post_rate)
            n = 0
            while at < self.window[1]:
                gevent.sleep(max(0.0, at - time.perf_counter()))
                self.post(n)
                n += 1
                at += self.rng.expovariate(cfg.post_rate)
        gevent.sleep(max(0.0, self.window[1] - time.perf_counter()))

    def _busy(self) -> bool:  # replies streaming, or posts the server has not shown yet
        return bool(self.pending_finals) or any(not p.answered for p in self.posts.values())

    def _away(self) -> bool:
        """Storm: a socket that has not dropped and come back yet (one given up is not waited for)."""
        return self.cfg.storm and any(
            not c.gave_up and (not (c.reconnects or c.resynced) or not c.alive) for c in self.conns
        )

    def drain(self) -> None:
        """Wait for the replies in flight to end everywhere, then judge what is left."""
        deadline = time.perf_counter() + self.cfg.drain_s
        while (self._busy() or self._away()) and time.perf_counter() < deadline:
            gevent.sleep(0.05)
        for msg in list(self.pending_finals):
            del self.pending_finals[msg]
            self._finish(msg, self._final_frames.pop(msg, None), unfinished=True)
        for post in self.posts.values():
            if not post.answered:
                self.collector.error("post.unanswered")

    def close(self) -> None:
        self.stopping = True
        open_at_end = sum(1 for c in self.conns if c.alive)
        self.collector.count("sockets_open_at_end", open_at_end)
        for c in self.conns:
            if c.alive:
                self._live("sockets", -1)
            c.alive = False
            if c.ws is not None:
                c.ws.close()
        gevent.joinall([c.greenlet for c in self.conns if c.greenlet is not None], timeout=5)
        for c in self.conns:
            if c.greenlet is not None and not c.greenlet.dead:
                c.greenlet.kill(block=False)
