"""One room's members, as the load generator plays them (gevent; only Locust imports this).

A :class:`RoomRun` logs its members in over HTTP (or uses the sessions the seed step
wrote), opens one WebSocket per member and tab, posts prompts that @mention the room's
assistants with Poisson arrivals, reads every frame at every member, checks every reply
(contiguous offsets, final text equal to the pieces) and measures it. All the members of
a room live in one process, one greenlet each, so the spread of one piece's arrival
across them (skew) is measured on one clock.

When the model emitted a piece's text is estimated as ``post + model TTFT + offset of
its token in the model's schedule``; the token is found by cutting the reply's text
back into the simulator's tokens (:func:`collab.simulator.text.split_tokens`). The
model's TTFT is not known per reply: the report subtracts the median TTFT measured by
a direct client of the model (see docs/loadtest.md, "Delivery lag").
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
import uuid
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any
from urllib.parse import quote

import gevent
import gevent.event
import gevent.lock

from collab.loadtest.agents import AgentWatch, post_in_turn
from collab.loadtest.client import LoginError, http_login
from collab.loadtest.config import RunConfig, ws_base
from collab.loadtest.stats import Collector
from collab.loadtest.wire import Parsed, parse_frame, words_of_text
from collab.loadtest.wsclient import ConnectionClosed, HandshakeError, WebSocket
from collab.simulator.text import split_tokens

__all__ = ["RoomRun"]

log = logging.getLogger("collab.loadtest")

Fire = Callable[..., None]  # Locust's events.request.fire

_CACHE_MAX = 8192  # distinct frames kept per room (members are never that far apart)
_RECONNECT_DELAY_S = 0.5
_MAX_RECONNECTS = 5
_QUESTIONS = (
    "how would you stream tokens to many people at once",
    "what makes a chat server slow under load",
    "explain back pressure in a websocket fan-out",
    "compare two ways to batch small messages",
    "how do you measure latency percentiles honestly",
)


_gate: gevent.lock.BoundedSemaphore | None = None


def _handshake_gate(size: int) -> gevent.lock.BoundedSemaphore:
    """The process's ration of WebSocket handshakes in progress."""
    global _gate
    if _gate is None:
        _gate = gevent.lock.BoundedSemaphore(max(1, size))
    return _gate


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
        self.greenlet: gevent.Greenlet | None = None
        # (sent, shown): when each of its posts left and when its own "new" frame came back
        self.posting: list[tuple[float, float]] = []


class RoomRun:
    """Play one room: log in, connect, post, read, check and measure; then report."""

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
        # Member i connects to server process i mod N (its tabs too): a room spans them all.
        for i, u in enumerate(self.users):
            for _ in range(max(1, cfg.sockets_per_member)):
                self.conns.append(Conn(len(self.conns), u["username"], cfg.server_of(i)))
        self.cache: dict[bytes, Parsed] = {}
        self.posts: dict[str, Post] = {}
        self.reply_post: dict[int, Post] = {}
        self.pending_finals: dict[int, set[int]] = {}
        self.in_flight: set[int] = set()
        self.stopping = False
        self.window = (float("inf"), float("inf"))  # posting phase, perf_counter clock
        self._canon: dict[int, tuple[str, bool]] = {}
        self._final_frames: dict[int, Parsed] = {}
        self._mention_text = " ".join("@" + a for a in self.assistants[: max(0, cfg.mentions)])
        self.agents = AgentWatch(collector, cfg.agent_script, cfg.tps, cfg.tick_ms) if cfg.agent_script else None

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
                self._event("connect", (time.perf_counter() - start) * 1000, exc=exc)
                if not self._retry(c):
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
                            ms = (now - start) * 1000
                            self.collector.add("connect_ms", ms)
                            self.collector.count("sockets")
                            self.collector.count(f"sockets_server_{c.server}")
                            self._live("sockets")
                            self._event("connect", ms)
                            c.ready.set()
            except ConnectionClosed as exc:
                if not released:
                    gate.release()
                if c.alive:
                    self._live("sockets", -1)
                c.alive = False
                if self.stopping:
                    return
                if exc.code == 4403:
                    self.collector.error("ws.forbidden")
                    c.ready.set()
                    return
                self.collector.error("ws.closed" if released else "ws.closed_before_snapshot")
                self._drop_member(c)
                if not self._retry(c):
                    return

    def _retry(self, c: Conn) -> bool:
        c.reconnects += 1
        if c.reconnects > _MAX_RECONNECTS or self.stopping:
            c.ready.set()
            return False
        self.collector.count("reconnects")
        gevent.sleep(_RECONNECT_DELAY_S)
        return True

    def _drop_member(self, c: Conn) -> None:
        """A socket went away: its replies so far are judged now, the rest after reconnect."""
        for msg in list(self.pending_finals):
            self._member_done(msg, c.index)

    # --- frames ------------------------------------------------------------------------

    def _on_frame(self, c: Conn, data: bytes, now: float) -> Parsed:
        cache = self.cache
        parsed = cache.get(data)
        in_window = self.window[0] <= now <= self.window[1]
        if parsed is None:
            parsed = parse_frame(data)
            if parsed.kind not in ("snapshot", "error"):
                cache[data] = parsed
                if len(cache) > _CACHE_MAX:
                    for key in list(cache)[: _CACHE_MAX // 2]:
                        del cache[key]
                self.collector.count("frames_total")
                if in_window:
                    self.collector.count("frames")
                if parsed.kind == "new":
                    self._on_new(parsed)
                if parsed.unescaped:  # once per frame, however many members receive it
                    self.collector.error("piece.unescaped", parsed.unescaped)
        if parsed.kind == "new":
            post = self.posts.get(parsed.nonce) if parsed.nonce else None
            if post is not None and post.poster == c.index:
                c.posting.append((post.at, now))
        kind = parsed.kind
        if self.agents is not None and (kind == "other" or kind == "final"):
            self.agents.on_frame(c.index, data, parsed, now)
        if kind != "snapshot" and kind != "error":
            self.collector.count("deliveries_total")
            if in_window:
                self.collector.count("deliveries")
        if kind == "delta":
            replies = c.replies
            for p in parsed.pieces:
                st = replies.get(p.msg)
                if st is None:
                    st = replies[p.msg] = MemberReply()
                self._piece(st, p, now)
        elif kind == "final":
            for a in parsed.articles:
                st = c.replies.get(a.msg)
                if st is None:
                    st = c.replies[a.msg] = MemberReply()
                st.final_at = now
                st.status = a.status
                if a.role == "assistant":
                    self._final(a.msg, parsed, c.index)
        elif kind == "snapshot":
            for a in parsed.articles:
                if a.status == "streaming" and a.raw:
                    st = c.replies[a.msg] = MemberReply(joined_late=True)
                    st.parts.append(a.body)
                    st.have = len(a.body)
                    length = a.attrs.get("data-length")
                    if length is not None and int(length) != st.have:
                        self.collector.count("chars_lost", abs(int(length) - st.have))
        elif kind == "error":
            for code, _text in parsed.errors:
                self.collector.error(code)
        return parsed

    def _piece(self, st: MemberReply, p: Any, now: float) -> None:
        offset = p.offset
        if offset == st.have:
            st.parts.append(p.text)
            st.have = p.end
        elif offset < st.have:
            overlap = min(st.have - offset, len(p.text))
            st.duplicated += overlap
            if p.end > st.have:
                st.parts.append(p.text[overlap:])
                st.have = p.end
        else:  # past a gap: held until the gap closes (then it came out of order) or the end
            held = st.ahead.get(offset)
            if held is not None:
                st.duplicated += min(len(held.text), len(p.text))
            if held is None or p.end > held.end:
                st.ahead[offset] = p
        if st.ahead and offset <= st.have:
            self._early(st)
        if st.first_at is None:
            st.first_at = now
        st.times.append((offset, p.end, now))
        self.collector.counts["pieces_total"] += 1

    @staticmethod
    def _early(st: MemberReply) -> None:
        """Pieces held past a gap that the text now reaches: they came out of order."""
        while st.ahead:
            offset = min(st.ahead)
            if offset > st.have:
                return
            q = st.ahead.pop(offset)
            overlap = min(st.have - offset, len(q.text))
            st.duplicated += overlap
            if q.end > st.have:
                st.parts.append(q.text[overlap:])
                st.out_of_order += q.end - st.have
                st.have = q.end

    def _on_new(self, parsed: Parsed) -> None:
        post = self.posts.get(parsed.nonce) if parsed.nonce else None
        if post is None:
            return
        post.answered = True
        for a in parsed.articles:
            if a.role == "assistant" and a.msg not in self.reply_post:
                post.replies.append(a.msg)
                self.reply_post[a.msg] = post
                self.pending_finals[a.msg] = {c.index for c in self.conns if c.alive}
                self.in_flight.add(a.msg)
                self._live("in_flight")
        if len(self.in_flight) > self.collector.peak_in_flight:
            self.collector.peak_in_flight = len(self.in_flight)

    def _final(self, msg: int, parsed: Parsed, index: int) -> None:
        if msg in self.pending_finals:
            self._member_done(msg, index, parsed)

    def _member_done(self, msg: int, index: int, parsed: Parsed | None = None) -> None:
        pending = self.pending_finals.get(msg)
        if pending is None:
            return
        if parsed is not None:
            self._final_frames[msg] = parsed
        pending.discard(index)
        if not pending:
            del self.pending_finals[msg]
            self._finish(msg, self._final_frames.pop(msg, None))

    # --- judging a finished reply ----------------------------------------------------------

    def _finish(self, msg: int, final: Parsed | None, unfinished: bool = False) -> None:
        """Every member has the reply's end (or the run is over): check and measure it."""
        col = self.collector
        post = self.reply_post.get(msg)
        if msg in self.in_flight:
            self.in_flight.discard(msg)
            self._live("in_flight", -1)
        article = final.articles[0] if final is not None and final.articles else None
        status = article.status if article is not None else ("unfinished" if unfinished else "lost")
        if status == "done":
            col.count("replies_completed")
            self._live("completed")
        else:
            col.count("replies_failed")
            col.error(f"reply.{status}")
            self._live("failed")
        agent = self.agents is not None and self.agents.finish(msg, post.at if post else None, final, self.conns)
        states = [(c, st) for c in self.conns if (st := c.replies.pop(msg, None)) is not None]
        texts = {c.index: "".join(st.parts) for c, st in states}
        final_words = final.final_words() if final is not None and status == "done" else None
        canon = self._canonical(msg, texts, final_words)
        tokens = split_tokens(canon)
        ends = list(accumulate(len(t) for t in tokens))
        n_tokens = len(tokens)
        data_tokens = article.attrs.get("data-tokens", "") if article is not None else ""
        if final_words is not None and data_tokens.isdigit() and int(data_tokens) != n_tokens:
            col.count("tokens_mismatch")
        # The reply's length: its text, or further when some member saw a piece past a gap.
        length = max([len(canon)] + [max(q.end for q in st.ahead.values()) for _c, st in states if st.ahead])
        last_end = 0.0
        for c, st in states:
            text = texts[c.index]
            # Characters this member never got (pieces held past a gap that never closed
            # were received, out of order: they are not lost).
            lost = max(0, length - st.have - sum(len(q.text) for q in st.ahead.values()))
            col.count("chars_lost", lost)
            col.count("chars_duplicated", st.duplicated)
            col.count("chars_out_of_order", st.out_of_order)
            bad = bool(lost or st.duplicated or st.out_of_order)
            if st.final_at is not None:
                col.count("member_replies")
                last_end = max(last_end, st.final_at)
                if final_words is not None and not self._canon_ok(msg, text, final_words):
                    col.count("final_mismatch")
                    bad = True
                if post is not None:
                    ms = (st.final_at - post.at) * 1000
                    col.add("reply_ms", ms)
                    exc = None if status == "done" and not bad else AssertionError(f"reply {msg}: {status}")
                    self._event("reply", ms, len(text), exc)
        if post is not None and n_tokens:
            if not agent:  # an agent's answer comes whole after its run: its log is timed instead
                self._timing(post, states, ends)
            lo, hi = self.window
            overlap = min(last_end or time.perf_counter(), hi) - max(post.at, lo)
            if overlap > 0:
                col.reply_seconds += overlap
        self._canon.pop(msg, None)

    def _canonical(self, msg: int, texts: dict[int, str], final_words: list[str] | None) -> str:
        """The reply's text: a member's whose words are the final article's, else the longest."""
        if final_words is not None:
            for text in texts.values():
                if self._canon_ok(msg, text, final_words):
                    return text
        return max(texts.values(), default="", key=len)

    def _sched_ms(self, j: int) -> float:
        """When the model wrote token ``j``, in ms after its first token (its schedule is fixed:
        ``collab.simulator.timing.token_offset`` less the TTFT; on the next tick if it has one)."""
        s = j / self.cfg.tps
        tick = self.cfg.tick_ms / 1000.0
        if tick > 0:
            s = math.ceil(s / tick - 1e-6) * tick
        return s * 1000.0

    def _timing(self, post: Post, states: list[tuple[Conn, MemberReply]], ends: list[int]) -> None:
        """Time to first token, delivery lag, skew and tokens/s of one reply, at every member.

        When the model emitted token ``j`` is ``S + sched(j)``, ``S`` the moment it wrote the
        first token, which a client cannot see. ``S`` is fitted to the reply: the earliest
        any member received a piece, less the schedule offset of that piece's newest token
        (a piece leaves the app at once or at the end of a coalescing window, so some piece
        reaches the fastest member within a millisecond or two of its newest token), and
        never before the post plus the model's configured TTFT. The lag from the post (the
        model asked the moment the member posted) is kept too: an upper bound that also
        holds what the app spends before it asks the model.
        """
        col = self.collector
        hists = col.hists
        n_tokens = len(ends)
        sched = self._sched_ms
        fit = math.inf
        for _c, st in states:
            for _offset, end, at in st.times:
                fit = min(fit, at * 1000 - sched(min(bisect_left(ends, end), n_tokens - 1)))
        if fit == math.inf:
            return
        anchor = max(fit, (post.at * 1000) + self.cfg.ttft_ms)
        arrivals: dict[int, list[float]] = {}
        lag, newest, from_post = hists["lag_ms"], hists["lag_newest_ms"], hists["lag_post_raw_ms"]
        post_ms = post.at * 1000
        for c, st in states:
            # Pieces that reached this member while the server handled a post of its own are
            # kept apart: the socket may be held up by its own post.
            posting = c.posting
            while posting and posting[0][1] < post.at - 60:
                posting.pop(0)
            if st.first_at is not None and not st.joined_late:
                ttft = (st.first_at - post.at) * 1000
                col.add("member_ttft_ms", ttft)
                self._event("first token", ttft)
            for offset, end, at in st.times:
                at_ms = at * 1000
                oldest = sched(bisect_right(ends, offset))
                lag.add(at_ms - anchor - oldest)
                busy = any(a <= at <= b + 0.005 for a, b in posting)
                hists["lag_while_posting_ms" if busy else "lag_otherwise_ms"].add(at_ms - anchor - oldest)
                newest.add(at_ms - anchor - sched(min(bisect_left(ends, end), n_tokens - 1)))
                from_post.add(at_ms - post_ms - oldest)
                arrivals.setdefault(offset, []).append(at)
            if len(st.times) >= 2 and n_tokens > 1 and not st.joined_late:
                span = st.times[-1][2] - st.times[0][2]
                if span > 0:
                    col.add("member_tokens_per_s", (n_tokens - 1) / span)
        for times in arrivals.values():
            if len(times) > 1:
                col.add("skew_ms", (max(times) - min(times)) * 1000)

    def _canon_ok(self, msg: int, text: str, final_words: list[str]) -> bool:
        seen = self._canon.get(msg)
        if seen is not None and seen[0] == text:
            return seen[1]
        ok = words_of_text(text) == final_words
        self._canon[msg] = (text, ok)
        return ok

    # --- posting -------------------------------------------------------------------------

    def post(self, index: int) -> None:
        c = self.conns[index % len(self.conns)]
        if c.ws is None or not c.alive:
            self.collector.error("post.no_socket")
            return
        nonce = "lt" + uuid.uuid4().hex[:16]
        question = self.rng.choice(_QUESTIONS)
        text = f"{self._mention_text} {nonce} {question}?".strip()
        if self.agents is not None:
            text = self.agents.prompt(self._mention_text, nonce)
        frame = json.dumps({"text": text, "client_id": str(uuid.uuid4())})
        post = Post(nonce, time.perf_counter(), c.index, self.cfg.mentions)
        self.posts[nonce] = post
        try:
            c.ws.send_text(frame)
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
        if cfg.runs > 0 and self.assistants:  # that many posts, each after the last reply ended
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

    def drain(self) -> None:
        """Wait for the replies in flight to end everywhere, then judge what is left."""
        deadline = time.perf_counter() + self.cfg.drain_s
        while self._busy() and time.perf_counter() < deadline:
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
