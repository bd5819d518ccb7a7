"""Following every reply at every member of a room, then checking and timing it.

:class:`RoomReplies` reads each frame a member's socket receives (parsed once per room,
however many members get it), follows each reply piece by piece at each member (gaps,
pieces twice or out of order) and, once every member has the reply's end, judges it:
the final text equal to the pieces, nothing lost, and its time to first token, delivery
lag, skew and tokens/s.

When the model emitted a piece's text is estimated as ``post + model TTFT + offset of
its token in the model's schedule``; the token is found by cutting the reply's text
back into the simulator's tokens (:func:`collab.simulator.text.split_tokens`). The
model's TTFT is not known per reply: the report subtracts the median TTFT measured by
a direct client of the model (see docs/loadtest.md, "Delivery lag").
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import Any

from collab.loadtest.room_state import Conn, MemberReply, Post, RoomState
from collab.loadtest.wire import Parsed, parse_frame, words_of_text
from collab.simulator.text import split_tokens

__all__ = ["RoomReplies"]

_CACHE_MAX = 8192  # distinct frames kept per room (members are never that far apart)


class RoomReplies(RoomState):
    """Reading a room's frames and judging its replies (a base of :class:`collab.loadtest.room.RoomRun`)."""

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
            if c.replies and self.cfg.storm:
                self._resume(c, parsed)
                return parsed
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

    def _resume(self, c: Conn, parsed: Parsed) -> None:
        """A socket back after a drop (storm): each reply it was following goes on from the
        snapshot, which must hold its text so far unchanged; a reply that ended meanwhile is
        the snapshot's whole article (docs/loadtest.md, "storm")."""
        shown = {a.msg: a for a in parsed.articles}
        for msg, st in list(c.replies.items()):
            a = shown.get(msg)
            if a is None:
                continue
            if a.status == "streaming" and a.raw:
                prior = "".join(st.parts)
                if not a.body.startswith(prior):
                    self.collector.count("storm_resume_mismatch")
                st.parts = [a.body]
                st.have = len(a.body)
                st.ahead.clear()
                self.collector.count("storm_resumed")
            elif msg in self.pending_finals:
                del c.replies[msg]  # ended while away: the page shows the snapshot's article whole
                self.collector.count("storm_ended_away")
                self._member_done(msg, c.index, Parsed("final", articles=[a]))
        for a in parsed.articles:  # a reply that began while the socket was away
            if a.status == "streaming" and a.raw and a.msg not in c.replies:
                st = c.replies[a.msg] = MemberReply(joined_late=True)
                st.parts.append(a.body)
                st.have = len(a.body)

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
        # The tokens the server read for it: its article's count, or (no article: it was still
        # streaming when the run ended) those of the text its members got.
        col.count("tokens", self._tokens_in_window(int(data_tokens) if data_tokens.isdigit() else n_tokens, states))
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

    def _tokens_in_window(self, tokens: int, states: list[tuple[Conn, MemberReply]]) -> int:
        """The reply's model tokens that the server read inside the measured window (CPU
        per token): its tokens in the share of its stream, from the first piece to the
        final article at the first member to get them (or, with no final article, the last
        piece any member got), that lies inside the window (the model streams at an even
        rate)."""
        finals = [st.final_at for _c, st in states if st.final_at is not None]
        lasts = [st.times[-1][2] for _c, st in states if st.times]
        if not finals and not lasts:
            return 0
        end = min(finals) if finals else max(lasts)
        start = min([st.first_at for _c, st in states if st.first_at is not None], default=end)
        lo, hi = self.window
        if end <= start:
            return tokens if lo <= end <= hi else 0
        return round(tokens * max(0.0, min(end, hi) - max(start, lo)) / (end - start))

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
