"""Mergeable measures of a load test: histograms, counters and the report they make.

Pure Python and JSON-serialisable: the simulated users fill a :class:`Collector` in each
load-generator process, the Locust master merges them, and the ``loadtest`` command
turns the merged one into the report docs/wire.md describes. Nothing here imports gevent,
Locust or the app.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["COUNTERS", "HISTOGRAMS", "Collector", "Histogram", "percentiles"]

# Resolution of a histogram: 0.1 ms up to 1 s, then 1 ms (values are milliseconds or
# tokens/s). Relative error stays under 0.1% past a few ms: finer than the clocks.
_FINE_LIMIT = 1000.0

# What the simulated users measure, in milliseconds unless named otherwise.
HISTOGRAMS = (
    "member_ttft_ms",  # post -> first piece of a reply, at each member
    "model_ttft_ms",  # the model's own first token, measured by a client of the model
    "lag_ms",  # piece arrival - when the model emitted its oldest token (schedule fitted per reply)
    "lag_newest_ms",  # the same against the piece's newest token
    "lag_while_posting_ms",  # lag_ms of pieces reaching a member while its own post is handled
    "lag_otherwise_ms",  # lag_ms of the other pieces
    "lag_post_raw_ms",  # arrival - (post + schedule offset of the oldest token); less model TTFT: upper bound
    "skew_ms",  # spread of one piece's arrival across the members of a room
    "member_tokens_per_s",  # tokens/s each member received per reply
    "reply_ms",  # post -> final article, at each member
    "connect_ms",  # WebSocket handshake -> snapshot frame
    "storm_back_ms",  # storm: a reconnected socket's snapshot, ms after posting began (wall clock)
    "storm_attempt_ms",  # storm: the start of its successful attempt -> that snapshot
    "storm_resync_ms",  # storm: a fresh snapshot on a socket that stayed open, ms after posting began
)

COUNTERS = (
    "chars_lost",
    "chars_duplicated",
    "chars_out_of_order",
    "replies_completed",
    "replies_failed",
    "member_replies",  # replies seen to their end by one member (a reply x its members)
    "final_mismatch",  # final article's text differs from the member's pieces
    "tokens_mismatch",  # final article's data-tokens differs from the pieces' token count
    "errors",
    "posts",
    "frames",  # distinct frames the server sent to the rooms, inside the measured window
    "deliveries",  # frames received by all members, inside the measured window
    "tokens",  # model tokens (data-tokens) the server read inside the measured window (room_replies._tokens_in_window)
    "frames_total",
    "deliveries_total",
    "pieces_total",
    "sockets",  # WebSockets that got their snapshot
    "sockets_open_at_end",
    "reconnects",
    "logins",
)


class Histogram:
    """Counts of values on a fixed grid; merging two adds their counts."""

    __slots__ = ("counts", "n")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0

    @staticmethod
    def _key(value: float) -> int:
        if -_FINE_LIMIT < value < _FINE_LIMIT:
            return round(value * 10)
        return round(value) * 10

    def add(self, value: float, count: int = 1) -> None:
        if value != value:  # NaN
            return
        key = self._key(value)
        self.counts[key] = self.counts.get(key, 0) + count
        self.n += count

    def extend(self, values: Iterable[float]) -> None:
        for v in values:
            self.add(v)

    def merge(self, other: Histogram) -> None:
        counts = self.counts
        for key, count in other.counts.items():
            counts[key] = counts.get(key, 0) + count
        self.n += other.n

    def quantile(self, q: float) -> float | None:
        """The smallest recorded value with at least ``q`` of the values at or below it."""
        if not self.n:
            return None
        rank = max(1, math.ceil(q * self.n))
        seen = 0
        for key in sorted(self.counts):
            seen += self.counts[key]
            if seen >= rank:
                return key / 10
        return max(self.counts) / 10

    def mean(self) -> float | None:
        if not self.n:
            return None
        return sum(k * c for k, c in self.counts.items()) / 10 / self.n

    def to_json(self) -> list[list[int]]:
        return [[k, c] for k, c in sorted(self.counts.items())]

    @classmethod
    def from_json(cls, data: Iterable[Iterable[int]]) -> Histogram:
        h = cls()
        for k, c in data:
            h.counts[int(k)] = h.counts.get(int(k), 0) + int(c)
            h.n += int(c)
        return h


def percentiles(h: Histogram, shift: float = 0.0) -> dict[str, float | int | None]:
    """The report's percentile object: ``p50``, ``p95``, ``p99``, ``max`` (and ``count``).

    ``shift`` is subtracted from every value (a percentile of ``x - c`` is the percentile
    of ``x`` less ``c``). With no values the four figures are ``null``.
    """

    def q(p: float) -> float | None:
        v = h.quantile(p)
        return None if v is None else round(v - shift, 1)

    return {"p50": q(0.50), "p95": q(0.95), "p99": q(0.99), "max": q(1.0), "count": h.n}


@dataclass
class Collector:
    """Everything the simulated users of one process (or, merged, of a whole run) measured."""

    hists: dict[str, Histogram] = field(default_factory=lambda: {name: Histogram() for name in HISTOGRAMS})
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    error_codes: dict[str, int] = field(default_factory=dict)
    # Sum over replies of their time in flight (post -> last member's final), seconds:
    # over the measured window, the mean number of concurrent replies.
    reply_seconds: float = 0.0
    peak_in_flight: int = 0
    window: list[float] = field(default_factory=list)  # [start, end] wall clock, the posting phase
    # CPU seconds and wall seconds of each load-generator process that ran users, from the
    # start of posting to the end of its last room (cumulative: merging keeps the largest).
    cpu: dict[str, list[float]] = field(default_factory=dict)
    rooms_done: int = 0

    def add(self, name: str, value: float) -> None:
        self.hists[name].add(value)

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def error(self, code: str, n: int = 1) -> None:
        self.counts["errors"] = self.counts.get("errors", 0) + n
        self.error_codes[code] = self.error_codes.get(code, 0) + n

    def merge(self, other: Collector) -> None:
        for name, h in other.hists.items():
            self.hists.setdefault(name, Histogram()).merge(h)
        for name, n in other.counts.items():
            self.counts[name] = self.counts.get(name, 0) + n
        for code, n in other.error_codes.items():
            self.error_codes[code] = self.error_codes.get(code, 0) + n
        self.reply_seconds += other.reply_seconds
        self.peak_in_flight += other.peak_in_flight  # peaks of separate rooms: an upper bound
        if other.window:
            if self.window:
                self.window = [min(self.window[0], other.window[0]), max(self.window[1], other.window[1])]
            else:
                self.window = list(other.window)
        for node, (cpu_s, wall_s) in other.cpu.items():  # cumulative per process: keep the latest
            mine = self.cpu.setdefault(node, [0.0, 0.0])
            mine[0] = max(mine[0], cpu_s)
            mine[1] = max(mine[1], wall_s)
        self.rooms_done += other.rooms_done

    def to_json(self) -> dict[str, Any]:
        return {
            "hists": {name: h.to_json() for name, h in self.hists.items()},
            "counts": dict(self.counts),
            "error_codes": dict(self.error_codes),
            "reply_seconds": self.reply_seconds,
            "peak_in_flight": self.peak_in_flight,
            "window": list(self.window),
            "cpu": {k: list(v) for k, v in self.cpu.items()},
            "rooms_done": self.rooms_done,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Collector:
        c = cls()
        for name, pairs in data.get("hists", {}).items():
            c.hists[name] = Histogram.from_json(pairs)
        for name, n in data.get("counts", {}).items():
            c.counts[name] = int(n)
        c.error_codes = {k: int(v) for k, v in data.get("error_codes", {}).items()}
        c.reply_seconds = float(data.get("reply_seconds", 0.0))
        c.peak_in_flight = int(data.get("peak_in_flight", 0))
        c.window = [float(x) for x in data.get("window", [])]
        c.cpu = {k: [float(v[0]), float(v[1])] for k, v in data.get("cpu", {}).items()}
        c.rooms_done = int(data.get("rooms_done", 0))
        return c

    @property
    def window_s(self) -> float:
        return self.window[1] - self.window[0] if len(self.window) == 2 else 0.0

    def generator_cpu_percent(self) -> float | None:
        """CPU of the processes that ran users, 100 = one core, over their own wall time."""
        if not self.cpu:
            return None
        return round(sum(100.0 * cpu_s / wall_s for cpu_s, wall_s in self.cpu.values() if wall_s > 0), 1)
