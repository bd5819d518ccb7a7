"""When each content token is written.

Token ``i`` (from 0) of a reply is due ``ttft + i / tps`` after the request
arrived (the ``x-sim-start`` header). With a tick ``T > 0`` a stream writes only
at ``ttft + k * T`` (k = 0, 1, ...), so token ``i`` goes out at the first such
instant not before its due time. :func:`token_offset` is that formula, for load
generators that want to know when the simulator sent a token; the server never
sends a token earlier, and later only by its event loop's lag.
"""

from __future__ import annotations

import asyncio
import math

__all__ = ["Schedule", "token_offset"]

# Float slack when turning a time into a token count or a tick number.
_EPS = 1e-6
# Longer waits than this also wake on disconnect/shutdown; shorter ones are
# plain sleeps (cheaper: this is the per-token hot path).
_WAKEABLE_WAIT = 0.05


def _on_tick(seconds: float, tick: float) -> float:
    return math.ceil(seconds / tick - _EPS) * tick if tick > 0 else seconds


def token_offset(index: int, tps: float, ttft_ms: float = 0.0, tick_ms: float = 0.0) -> float:
    """Seconds from request receipt to the scheduled write of content token ``index``."""
    return ttft_ms / 1000.0 + _on_tick(index / tps, tick_ms / 1000.0)


class Schedule:
    """A stream's schedule on the event loop's clock: token ``i`` due at ``first + i / tps``."""

    __slots__ = ("first", "tick", "tps")

    def __init__(self, first: float, tps: float, tick: float = 0.0) -> None:
        self.first = first  # loop time of token 0
        self.tps = tps
        self.tick = tick  # seconds; 0 = no tick

    def due(self, now: float, limit: int) -> int:
        """How many tokens (capped at ``limit``) are due at loop time ``now``."""
        if now < self.first:
            return 0
        if self.tick > 0:  # a tick served late counts only what its own tick time had due
            now = self.first + math.floor((now - self.first) / self.tick + _EPS) * self.tick
        return min(limit, math.floor((now - self.first) * self.tps + _EPS) + 1)

    def write_time(self, index: int) -> float:
        """Loop time at which token ``index`` is to be written (its due time, or the tick after)."""
        return self.first + _on_tick(index / self.tps, self.tick)

    @staticmethod
    async def wait_until(deadline: float, stop: asyncio.Event) -> bool:
        """Sleep until loop time ``deadline``; ``False`` if ``stop`` fired first."""
        delay = deadline - asyncio.get_running_loop().time()
        if delay <= 0:
            return not stop.is_set()
        if delay < _WAKEABLE_WAIT:
            await asyncio.sleep(delay)
            return not stop.is_set()
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except TimeoutError:
            return True
        return False
