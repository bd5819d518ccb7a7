"""Agent runs in the load test (issue 13; docs/loadtest.md, scenario ``agents``).

An agent's reply streams its run log (plan, tool calls, results, checks) as pieces of
``msg-N-thinking`` with offsets of their own, then its final answer on ``msg-N-body``
in one go when the run ends (docs/architecture.md#a-agents). :class:`AgentWatch` is
what a :class:`collab.loadtest.room.RoomRun` adds to itself when the run config has an
agent script: it reads the log pieces at every member (parsed once per distinct frame),
checks them against the log of the final article, and measures each run:

- time to the first visible step: post -> the first log piece, at each member (the
  "▸ Plan" line, sent before the model is asked), and to the model's first words in it;
- total run time: post -> the final article, at each member;
- steps per second: the final article's ``data-steps`` over that time;
- the delivery lag of the log's model text, fitted per model call (below), and its skew.

The answer's own pieces are checked by the room as for any reply; only its timing
against the model's schedule is skipped (the answer comes whole, after the run).

Delivery lag, per model call: every call's words stream into the log after a heading
("▸ Plan", "▸ Step N", "▸ Check: ", "▸ Revised plan"). The words are cut back into the
simulator's tokens (``split_tokens``) and the call's start is fitted as the load test
does for a plain reply (docs/loadtest.md, "Delivery lag"): the earliest arrival of a
piece at any member less the schedule offset of its newest token. A piece's lag is its
arrival less the emission time of its oldest token of that call. Headings and tool lines
are not the model's and are not timed.

Pure but for :func:`post_in_turn` (gevent, imported there): the report and the tests
use the rest without Locust.
"""

from __future__ import annotations

import math
import re
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from collab.loadtest.stats import Collector, Histogram, percentiles
from collab.loadtest.wire import (
    Parsed,
    Piece,
    ThinkingShown,
    thinking_pieces,
    thinking_shown,
    words_of_html,
    words_of_text,
)
from collab.simulator.text import split_tokens

__all__ = ["AGENT_HISTOGRAMS", "AgentWatch", "agent_report", "post_in_turn", "thinking_of"]

_HEADING = re.compile(r"▸ (?:Plan|Step \d+|Revised plan)\n|▸ Check: ")
_MARKS = "▸✓■→←✗"  # what starts a line of the log that is not the model's
_CACHE_MAX = 4096

# Histograms this module fills (Collector.hists takes any name; report.build_step reads them).
AGENT_HISTOGRAMS = (
    "agent_first_step_ms",  # post -> first log piece, at each member
    "agent_first_words_ms",  # post -> first log piece with the model's words (the plan's), at each member
    "agent_run_ms",  # post -> final article, at each member
    "agent_csteps_per_s",  # data-steps / run time, x100 (the histogram's 0.1 grid -> 0.001)
    "agent_steps",  # data-steps per run
)


def thinking_of(article_html: str) -> ThinkingShown | None:
    """The run log an article shows (its ``thinking-body``); None without one."""
    shown = thinking_shown(article_html)
    return shown[0] if shown else None


def same_log(streamed: str, shown: ThinkingShown) -> bool:
    """Whether an ended run's log shows what streamed: as written, or, rendered at its end
    (docs/wire.md), the same words."""
    if shown.rendered:
        return words_of_text(streamed) == words_of_html(shown.text)
    return streamed == shown.text


@dataclass(slots=True)
class Log:
    """One member's view of one run's log."""

    have: int = 0
    parts: list[str] = field(default_factory=list)
    times: list[tuple[int, int, float]] = field(default_factory=list)  # (offset, end, arrival)
    lost: int = 0  # characters skipped by a piece past a gap
    duplicated: int = 0

    def add(self, p: Piece, now: float) -> None:
        if p.offset > self.have:  # a gap: never filled (pieces come in order or not at all)
            self.lost += p.offset - self.have
            self.parts.append("\0" * (p.offset - self.have))
            self.have = p.offset
        if p.offset < self.have:
            overlap = min(self.have - p.offset, len(p.text))
            self.duplicated += overlap
            if p.end > self.have:
                self.parts.append(p.text[overlap:])
                self.have = p.end
        else:
            self.parts.append(p.text)
            self.have = p.end
        self.times.append((p.offset, p.end, now))

    @property
    def text(self) -> str:
        return "".join(self.parts)


class AgentWatch:
    """The agent side of one room's run: its members' logs, checked and measured."""

    def __init__(self, collector: Collector, script: str, tps: float, tick_ms: float = 0.0) -> None:
        self.collector = collector
        self.script = script
        self.tps = tps
        self.tick_ms = tick_ms
        self._pieces: dict[bytes, list[Piece]] = {}
        self._final_logs: dict[int, ThinkingShown] = {}  # msg -> the log its final article shows
        self.logs: dict[int, dict[int, Log]] = {}  # msg -> member index -> its view

    def prompt(self, mentions: str, nonce: str) -> str:
        return f"{mentions} {nonce} {self.script}".strip()

    # --- frames (called by the room for frames it does not read itself) --------------------

    def on_frame(self, member: int, data: bytes, parsed: Parsed, now: float) -> None:
        if parsed.kind == "final":
            msg = parsed.articles[0].msg if parsed.articles else 0
            if msg and msg not in self._final_logs:
                log = thinking_of(data.decode("utf-8", "replace"))
                if log is not None:
                    self._final_logs[msg] = log
            return
        if not data.startswith(b'<div id="msg-'):
            return
        pieces = self._pieces.get(data)
        if pieces is None:
            pieces = thinking_pieces(data)
            self._pieces[data] = pieces
            if len(self._pieces) > _CACHE_MAX:
                for key in list(self._pieces)[: _CACHE_MAX // 2]:
                    del self._pieces[key]
        for p in pieces:
            self.logs.setdefault(p.msg, {}).setdefault(member, Log()).add(p, now)

    # --- a run ended everywhere ------------------------------------------------------------

    def finish(self, msg: int, post_at: float | None, final: Parsed | None, conns: Iterable[Any]) -> bool:
        """Judge and measure run ``msg`` (before the room drops its members' replies): every
        socket of the room (``conns``) should have its log and its final article. False
        when ``msg`` was no agent run."""
        finals = members_expected(conns, msg)
        logs = self.logs.pop(msg, {})
        final_log = self._final_logs.pop(msg, None)
        article = final.articles[0] if final is not None and final.articles else None
        steps_attr = article.attrs.get("data-steps", "") if article is not None else ""
        if not logs and final_log is None and not steps_attr:
            return False
        col = self.collector
        col.count("agent_runs")
        steps = int(steps_attr) if steps_attr.isdigit() else None
        if steps is not None:
            _hist(col, "agent_steps").add(steps)
        elif article is not None:
            col.count("agent_steps_missing")
        for member, final_at in finals.items():
            log = logs.get(member)
            if final_at is None:
                col.count("agent_finals_missing")
            if log is None:
                col.count("agent_logs_missing")
                continue
            col.count("agent_log_chars_lost", log.lost)
            col.count("agent_log_chars_duplicated", log.duplicated)
            if final_log is not None and not same_log(log.text, final_log):
                col.count("agent_log_mismatch")
            if post_at is None:
                continue
            _hist(col, "agent_first_step_ms").add((log.times[0][2] - post_at) * 1000)
            if final_at is not None:
                run_s = final_at - post_at
                _hist(col, "agent_run_ms").add(run_s * 1000)
                if steps is not None and run_s > 0:
                    _hist(col, "agent_csteps_per_s").add(100 * steps / run_s)
        streamed = max((lg.text for lg in logs.values()), key=len, default="")
        canon = final_log.text if final_log is not None and not final_log.rendered else streamed  # offsets: raw text
        calls = calls_of(canon)
        if calls and post_at is not None:
            words_at = calls[0][0]
            for log in logs.values():
                first = next((at for _o, end, at in log.times if end > words_at), None)
                if first is not None:  # also the table's first token (so "added TTFT" is the app's)
                    _hist(col, "agent_first_words_ms").add((first - post_at) * 1000)
                    col.add("member_ttft_ms", (first - post_at) * 1000)
        self._timing(calls, list(logs.values()))
        return True

    def _sched_ms(self, j: int) -> float:
        s = j / self.tps
        tick = self.tick_ms / 1000.0
        if tick > 0:
            s = math.ceil(s / tick - 1e-6) * tick
        return s * 1000.0

    def _timing(self, calls: list[tuple[int, list[int]]], views: list[Log]) -> None:
        """Delivery lag of the model's words in the log (fitted per call, ``calls_of``) and skew."""
        col = self.collector
        sched = self._sched_ms
        for start, ends in calls:
            last = ends[-1]
            fit = math.inf
            for v in views:
                for offset, end, at in v.times:
                    if end > start and offset < last:
                        fit = min(fit, at * 1000 - sched(min(bisect_left(ends, end), len(ends) - 1)))
            if fit == math.inf:
                continue
            for v in views:
                for offset, end, at in v.times:
                    if end > start and offset < last:  # against its oldest text of this call
                        at_ms = at * 1000
                        col.add("lag_ms", at_ms - fit - sched(bisect_right(ends, max(offset, start))))
                        newest = sched(min(bisect_left(ends, end), len(ends) - 1))
                        col.add("lag_newest_ms", at_ms - fit - newest)
        arrivals: dict[int, list[float]] = {}
        for v in views:
            for offset, _end, at in v.times:
                arrivals.setdefault(offset, []).append(at)
        for times in arrivals.values():
            if len(times) > 1:
                col.add("skew_ms", (max(times) - min(times)) * 1000)


def calls_of(log: str) -> list[tuple[int, list[int]]]:
    """The model's words in a run log: per call, where they start and the absolute end of
    each of their tokens."""
    out = []
    for m in _HEADING.finditer(log):
        start = m.end()
        stop = len(log)
        for mark in _MARKS:
            at = log.find(mark, start)
            if at != -1 and at < stop:
                stop = at
        if stop < len(log) and log[stop] in "▸✓■" and stop > start and log[stop - 1] == "\n":
            stop -= 1  # the next heading's own line break
        tokens = split_tokens(log[start:stop])
        if tokens:
            out.append((start, [start + e for e in accumulate(len(t) for t in tokens)]))
    return out


def _hist(col: Collector, name: str) -> Histogram:
    return col.hists.setdefault(name, Histogram())


def agent_report(col: Collector) -> dict[str, Any] | None:
    """The report's ``agents`` object (None when the level ran no agent)."""
    c = col.counts
    if not c.get("agent_runs"):
        return None
    per_s = _hist(col, "agent_csteps_per_s")
    scaled = percentiles(per_s)
    steps_per_s = {k: (round(v / 100, 3) if isinstance(v, float) and k != "count" else v) for k, v in scaled.items()}
    return {
        "runs": c.get("agent_runs", 0),
        "first_step_ms": percentiles(_hist(col, "agent_first_step_ms")),
        "first_words_ms": percentiles(_hist(col, "agent_first_words_ms")),
        "steps_per_s": steps_per_s,
        "run_ms": percentiles(_hist(col, "agent_run_ms")),
        "steps": percentiles(_hist(col, "agent_steps")),
        "finals_missing": c.get("agent_finals_missing", 0),
        "logs_missing": c.get("agent_logs_missing", 0),
        "log_mismatch": c.get("agent_log_mismatch", 0),
        "log_chars_lost": c.get("agent_log_chars_lost", 0),
        "log_chars_duplicated": c.get("agent_log_chars_duplicated", 0),
        "steps_missing": c.get("agent_steps_missing", 0),
    }


def agent_line(report: dict[str, Any] | None, label: str = "") -> str:
    """One line for a level's ``agents`` object ("" without); ``label``: which level."""
    if not report:
        return ""

    def pair(d: dict[str, Any], digits: int = 0) -> str:
        def one(v: Any) -> str:
            return "-" if v is None else f"{v:,.{digits}f}"

        return f"{one(d.get('p50'))}/{one(d.get('p99'))}"

    return (
        f"agents{label}: {report['runs']} runs; first step p50/p99 {pair(report['first_step_ms'], 1)} ms"
        f" (first words {pair(report.get('first_words_ms') or {}, 1)} ms),"
        f" total {pair(report['run_ms'])} ms, steps/s {pair(report['steps_per_s'], 2)},"
        f" steps p50 {report['steps']['p50']}; finals missing {report['finals_missing']},"
        f" log mismatch {report['log_mismatch']}, log lost/dup"
        f" {report['log_chars_lost']}/{report['log_chars_duplicated']}"
    )


def post_in_turn(runs: int, post: Callable[[int], None], busy: Callable[[], bool], until: float) -> None:
    """``runs`` posts one after another: each once the previous run ended at every member
    (or ``until``, perf_counter, passed)."""
    import gevent

    for n in range(runs):
        post(n)
        while busy() and time.perf_counter() < until:
            gevent.sleep(0.01)


def members_expected(conns: Iterable[Any], msg: int) -> dict[int, float | None]:
    """Each socket of the room -> when run ``msg``'s final article reached it (None: never)."""
    out: dict[int, float | None] = {}
    for c in conns:
        st = c.replies.get(msg)
        out[c.index] = st.final_at if st is not None else None
    return out
