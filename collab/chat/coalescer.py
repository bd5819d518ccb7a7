"""A reply's tokens become pieces (the streaming engine's flusher, generation.py).

    Coalescer.push(token) ──> first piece at once ──> then one piece per window, on the
                              ticks of WindowClock (shared by every reply of the process)
                              ──> emit(offset, text), awaited, in order

Every reply's window ends on the same tick, so that the pieces of all the replies a
process streams are handed over in one loop turn and their Redis scripts go as one
pipeline (shared/batch.py; docs/benchmarks/2026-12-04.md#b-pipeline-per-window).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import weakref
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

Emit = Callable[[int, str], Awaitable[None]]


def ready() -> asyncio.Future[None]:
    """A reader's wait that is over already: no window to wait for (Coalescer.pace)."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    done.set_result(None)
    return done


def _release(hold: asyncio.Future[None] | None) -> None:
    if hold is not None and not hold.done():
        hold.set_result(None)


class _Tick:
    __slots__ = ("handle", "readers", "waiters")

    def __init__(self, handle: asyncio.TimerHandle) -> None:
        self.handle = handle
        self.readers: list[asyncio.Future[None]] = []  # woken first: the model streams' readers
        self.waiters: list[asyncio.Future[None]] = []  # then the coalescers, which hand over pieces


class WindowClock:
    """Where every coalescer of a loop waits out its window: windows end on one grid of
    ticks a window apart, so that the pieces of every reply this process streams are
    handed over in the same loop turn, and their Redis scripts go as one pipeline
    (shared/batch.py; docs/benchmarks/2026-12-04.md#b-pipeline-per-window). One timer per
    tick for the whole process, not one per reply and window. The grid's phase is drawn
    per process: `loop.time()` is the machine's monotonic clock, and the processes of
    one machine should not all wake in the same instant.

    `wait` returns a future that the first tick at least half a window away resolves:
    a reply that streams steadily gets a piece every window, on the grid; the gap after
    a piece sent at once (the first, or one after an idle spell) is half a window to one
    and a half."""

    def __init__(self) -> None:
        self._phase = random.random()  # of a window
        self._ticks: dict[tuple[float, int], _Tick] = {}

    def wait(
        self, window_s: float, key: tuple[float, int] | None = None, reader: bool = False
    ) -> tuple[asyncio.Future[None], tuple[float, int]]:
        """The future of the next tick at least half a window away (of tick `key`, if one
        is given and has not fired: else it resolves at once). A `reader`'s resolves
        before every coalescer's of its tick: what it reads then goes in that tick's pieces."""
        loop = asyncio.get_running_loop()
        hold: asyncio.Future[None] = loop.create_future()
        if key is not None:
            tick = self._ticks.get(key)
        else:
            key = (window_s, math.ceil((loop.time() + window_s / 2) / window_s - self._phase))
            tick = self._ticks.get(key)
            if tick is None:
                tick = self._ticks[key] = _Tick(loop.call_at((key[1] + self._phase) * window_s, self._fire, key))
        if tick is None:  # the given tick fired already
            hold.set_result(None)
        else:
            (tick.readers if reader else tick.waiters).append(hold)
        return hold, key

    def forget(self, key: tuple[float, int], hold: asyncio.Future[None]) -> None:
        """A waiter that no longer waits (its coalescer closed or was cancelled); the
        tick's timer goes when nobody is left to wake. A tick that fired is gone already."""
        tick = self._ticks.get(key)
        if tick is None:
            return
        tick.readers = [w for w in tick.readers if w is not hold]
        tick.waiters = [w for w in tick.waiters if w is not hold]
        if not tick.waiters and not tick.readers:
            tick.handle.cancel()
            del self._ticks[key]

    def _fire(self, key: tuple[float, int]) -> None:
        tick = self._ticks.pop(key, None)
        if tick is not None:
            for hold in tick.readers:  # first: their tasks run, and push, before the coalescers'
                if not hold.done():
                    hold.set_result(None)
            for hold in tick.waiters:
                if not hold.done():
                    hold.set_result(None)


_clocks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, WindowClock] = weakref.WeakKeyDictionary()


def window_clock() -> WindowClock:
    """The running loop's clock (a process has one loop that streams; tests have many)."""
    loop = asyncio.get_running_loop()
    clock = _clocks.get(loop)
    if clock is None:
        clock = _clocks[loop] = WindowClock()  # holds no reference to the loop: the entry goes with it
    return clock


class Coalescer:
    """Batches pushed text into pieces: the first piece goes at once, then one per
    `window_s` on the process's clock (WindowClock: every reply's window ends together);
    an idle stream's next piece goes at once again.

    `emit(offset, text)` is awaited for each piece, one at a time, in order; the pieces
    are contiguous (each offset is the sum of the lengths before it). If `emit` fails,
    no further piece is emitted (members would see a gap); `close()` still returns and
    the caller's final text repairs what members missed.
    """

    def __init__(self, window_s: float, emit: Emit) -> None:
        self.window_s = window_s
        self.flushed = 0  # characters handed to emit
        self.failed: BaseException | None = None
        self._emit = emit
        self._pending: list[str] = []
        self._wake = asyncio.Event()
        self._closing = False
        self._hold: asyncio.Future[None] | None = None  # the window's wait, while one runs
        self._tick: tuple[float, int] | None = None  # the tick it waits for
        self._clock = window_clock()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def push(self, text: str) -> None:
        self._pending.append(text)
        self._wake.set()

    def pace(self) -> asyncio.Future[None]:
        """For the reader that pushes here: the wait until this coalescer's next piece is
        due, resolved just before it is handed over (WindowClock: a tick's readers are
        woken before its coalescers). A steady stream is then read once a window, all that
        came meanwhile in one read, instead of once a socket read, and no token waits longer
        than it would have (docs/benchmarks/2026-12-05.md#b-window-read). Resolved at
        once when there is no window (0: a piece per token) or the pieces stopped. The
        reader may resolve it sooner itself: its stream's body ended meanwhile, and what is
        left of it is read at once (llm.client.stream_chat); its tick then no longer waits
        for it, nor does a cancelled wait keep the tick's timer."""
        if self.window_s <= 0 or self._closing or self.failed is not None or self._task.done():
            return ready()
        hold = self._hold
        # Its current window's tick while it holds; else the next one (which its next
        # piece, handed over now, will wait for too, or a later one).
        key = self._tick if hold is not None and not hold.done() else None
        clock = self._clock
        wait, key = clock.wait(self.window_s, key, reader=True)
        if not wait.done():
            wait.add_done_callback(functools.partial(clock.forget, key))  # a no-op once the tick fired
        return wait

    async def close(self) -> None:
        """Flush what is pending now (no window wait) and stop."""
        self._closing = True
        self._wake.set()
        _release(self._hold)
        await asyncio.shield(self._task)

    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception as exc:  # the sink failed: stop emitting, keep the text
            self.failed = exc
            log.warning("pieces stopped: %r", exc)

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._pending:
                # Window 0 is "no coalescing" (the load test's naive baseline): a frame per token.
                texts = ["".join(self._pending)] if self.window_s > 0 else list(self._pending)
                self._pending.clear()
                for text in texts:
                    offset = self.flushed
                    self.flushed += len(text)
                    await self._emit(offset, text)
            if self._closing:
                if not self._pending:
                    return
                continue
            if self.window_s <= 0:
                continue
            # Hold the next piece back until the process's next tick (WindowClock); close()
            # cuts it short. A future, not a timeout around an event: no cancellation and
            # exception per window (docs/benchmarks/2026-12-04.md#b-frame-path).
            clock = self._clock
            self._hold, tick = clock.wait(self.window_s)
            self._tick = tick
            try:
                await self._hold
            finally:
                clock.forget(tick, self._hold)  # cut short (close, cancel); after the tick, a dict miss
