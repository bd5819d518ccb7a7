"""Admission control: how many room sockets this process takes per second, and the
retry hint it gives the others (docs/wire.md, "Close codes the server sends": 4429).

A token bucket refilled at `COLLAB_CONNECT_RATE` per second, its burst the same (0: no
limit). A socket past it is accepted and closed at once with 4429 and `retry=MS`, before
any database or channel-layer work, so that a reconnect storm costs this process a
handshake per socket and not a snapshot it cannot finish in time. Each refused socket is
promised its own later slot (one every 1/rate seconds after the ones promised before it),
so a storm's hints spread the sockets out instead of sending them all back together.
A draining process (SIGTERM) refuses every socket with a short hint: the page goes to
another process soon, without the longer back-off of a dropped connection.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from django.conf import settings

from collab.chat import metrics

CLOSE_COME_BACK_LATER = 4429  # docs/wire.md: closed with reason "retry=MS"
MIN_HINT_MS = 250  # a hint never shorter: the page's own floor of a retry
MAX_HINT_MS = 30_000  # nor longer: past it the page's jitter spreads them anyway
DRAINING_HINT_MS = 250  # docs/wire.md: a draining process sends its sockets elsewhere soon


class Bucket:
    """A token bucket of `rate` tokens per second (burst `rate`, at least 1), and the slots promised
    to the sockets it refused. `admit()` returns None (take the socket) or the hint in
    milliseconds."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(1.0, rate)  # a rate under 1/s still admits one socket at a time
        self.clock = clock
        self.tokens = self.burst
        self.at = clock()
        self.promised = 0.0  # the latest slot promised to a refused socket (clock time)

    def admit(self) -> int | None:
        if self.rate <= 0:
            return None
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return None
        # When a token is free for this socket: after the next one, and after every slot
        # already promised (each promise takes one token's time).
        slot = max(now + (1 - self.tokens) / self.rate, self.promised + 1 / self.rate)
        slot = min(slot, now + MAX_HINT_MS / 1000)
        self.promised = slot
        return max(MIN_HINT_MS, min(MAX_HINT_MS, math.ceil((slot - now) * 1000)))  # never before the slot


_bucket: Bucket | None = None


def bucket() -> Bucket:
    """This process's bucket, from `COLLAB["CONNECT_RATE"]` (made again if it changed)."""
    global _bucket
    rate = float(settings.COLLAB["CONNECT_RATE"])
    if _bucket is None or _bucket.rate != rate:
        _bucket = Bucket(rate)
    return _bucket


def refusal(draining: bool) -> int | None:
    """None when this socket may connect (counted), else its retry hint in ms (counted
    by reason). Touches no database and no channel layer."""
    if draining:
        metrics.CONNECTS_REFUSED.labels(reason="draining").inc()
        return DRAINING_HINT_MS
    hint = bucket().admit()
    if hint is not None:
        metrics.CONNECTS_REFUSED.labels(reason="rate").inc()
        return hint
    metrics.CONNECTS.inc()
    return None


def reason(hint_ms: int) -> str:
    """The close reason of a 4429 (docs/wire.md)."""
    return f"retry={hint_ms}"
