"""The coalescer (coalescer.Coalescer): a reply's tokens become pieces, the first at once,
then one per window on ticks every reply of the process shares (coalescer.WindowClock);
`close()` flushes what waits without waiting the window out."""

from __future__ import annotations

import asyncio

import pytest

from collab.chat.coalescer import Coalescer, WindowClock, window_clock

HOUR = 3600.0  # a window no test waits out: were close() not to cut it short, the test would time out


class Pieces:
    def __init__(self) -> None:
        self.got: list[tuple[int, str]] = []
        self.arrived = asyncio.Event()
        self.fail = False

    async def emit(self, offset: int, text: str) -> None:
        if self.fail:
            raise RuntimeError("the sink is away")
        self.got.append((offset, text))
        self.arrived.set()

    async def next(self) -> None:
        await self.arrived.wait()
        self.arrived.clear()


async def test_the_first_piece_goes_at_once_and_the_rest_wait_for_the_window() -> None:
    pieces = Pieces()
    coalescer = Coalescer(HOUR, pieces.emit)
    coalescer.push("Hel")
    await pieces.next()
    assert pieces.got == [(0, "Hel")]
    for token in ("lo", ", ", "world"):  # inside the window: held back, together
        coalescer.push(token)
    await asyncio.sleep(0)  # let the coalescer run: it must not emit inside the window
    await asyncio.sleep(0)
    assert pieces.got == [(0, "Hel")]
    await coalescer.close()
    assert pieces.got == [(0, "Hel"), (3, "lo, world")]
    assert coalescer.flushed == len("Hello, world")


async def test_close_cuts_the_window_short_and_ends() -> None:
    pieces = Pieces()
    coalescer = Coalescer(HOUR, pieces.emit)
    coalescer.push("a")
    await pieces.next()
    await coalescer.close()  # waiting in its window: released, nothing pending
    assert pieces.got == [(0, "a")]
    assert coalescer._task.done()


async def test_a_window_ends_on_its_timer() -> None:
    pieces = Pieces()
    coalescer = Coalescer(0.001, pieces.emit)
    coalescer.push("a")
    await pieces.next()
    coalescer.push("b")
    await pieces.next()  # the timer ends the window: no close() needed
    assert pieces.got == [(0, "a"), (1, "b")]
    await coalescer.close()


async def test_offsets_are_contiguous_over_many_windows() -> None:
    pieces = Pieces()
    coalescer = Coalescer(0.001, pieces.emit)
    text = [f"t{i} " for i in range(200)]
    for i, token in enumerate(text):
        coalescer.push(token)
        if i % 17 == 0:
            await asyncio.sleep(0.002)
    await coalescer.close()
    offset = 0
    for at, piece in pieces.got:
        assert at == offset
        offset += len(piece)
    assert "".join(p for _, p in pieces.got) == "".join(text)
    assert 1 < len(pieces.got) < len(text)


async def test_window_zero_is_a_piece_per_push() -> None:
    pieces = Pieces()
    coalescer = Coalescer(0, pieces.emit)
    for token in ("a", "b", "c"):
        coalescer.push(token)
    await coalescer.close()
    assert pieces.got == [(0, "a"), (1, "b"), (2, "c")]


async def test_a_failing_sink_stops_the_pieces_and_close_still_returns() -> None:
    pieces = Pieces()
    pieces.fail = True
    coalescer = Coalescer(HOUR, pieces.emit)
    coalescer.push("a")
    await coalescer.close()
    assert isinstance(coalescer.failed, RuntimeError)
    assert pieces.got == []


async def test_a_cancelled_coalescer_leaves_no_timer() -> None:
    pieces = Pieces()
    coalescer = Coalescer(HOUR, pieces.emit)
    coalescer.push("a")
    await pieces.next()
    await asyncio.sleep(0)  # into its window's wait
    assert coalescer._hold is not None and not coalescer._hold.done()
    loop = asyncio.get_running_loop()
    assert _live_timers(loop) == 1  # the window's
    coalescer._task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await coalescer._task
    assert coalescer._hold.cancelled()
    assert _live_timers(loop) == 0


def _live_timers(loop: asyncio.AbstractEventLoop) -> int:
    """The window clock's tick timers the (standard) loop still holds, not cancelled."""
    scheduled = loop._scheduled  # type: ignore[attr-defined]
    return sum(
        1
        for handle in scheduled
        if getattr(handle._callback, "__func__", None) is WindowClock._fire and not handle.cancelled()
    )


async def test_every_coalescer_s_window_ends_on_the_same_tick() -> None:
    """Replies that started apart hand their next pieces over in one loop turn (so that
    their Redis scripts go as one pipeline: shared/batch.py), on the window's grid."""
    window = 0.05
    loop = asyncio.get_running_loop()
    turns: list[tuple[str, float]] = []

    def recorder(name: str) -> Pieces:
        pieces = Pieces()
        emit = pieces.emit

        async def emit_and_note(offset: int, text: str) -> None:
            turns.append((name, loop.time()))
            await emit(offset, text)

        pieces.emit = emit_and_note  # type: ignore[method-assign]
        return pieces

    a, b = recorder("a"), recorder("b")
    clock = window_clock()
    await clock.wait(window)[0]  # just after a tick: the test's timing does not depend on the grid's phase
    first = Coalescer(window, a.emit)
    first.push("x")
    await a.next()
    await asyncio.sleep(window / 5)  # the second reply starts a fifth of a window later
    second = Coalescer(window, b.emit)
    second.push("y")
    await b.next()
    first.push("x2")
    second.push("y2")
    await a.next()
    await b.next()
    later = dict(turns[2:])
    a_at, b_at = later["a"], later["b"]
    assert abs(b_at - a_at) < window / 10  # the same tick, not a window of each one's own
    assert a_at - turns[0][1] >= window / 2  # at least half a window after a piece sent at once
    await first.close()
    await second.close()


async def test_closing_one_coalescer_leaves_the_others_waiting_for_the_tick() -> None:
    pieces, others = Pieces(), Pieces()
    closing, waiting = Coalescer(HOUR, pieces.emit), Coalescer(HOUR, others.emit)
    closing.push("a")
    waiting.push("b")
    await pieces.next()
    await others.next()
    await asyncio.sleep(0)  # both in their windows' wait, on one tick
    waiting.push("held")
    await closing.close()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert others.got == [(0, "b")]  # still held: close() released its own coalescer alone
    loop = asyncio.get_running_loop()
    assert _live_timers(loop) == 1  # the tick's timer, for the one still waiting
    await waiting.close()
    assert others.got == [(0, "b"), (1, "held")]
    assert _live_timers(loop) == 0  # nobody waits: no timer left


async def test_a_tick_waits_for_its_own_coalescers_only() -> None:
    """Waiters of one tick share its timer; forgetting one keeps it for the other."""
    clock = window_clock()
    hold, key = clock.wait(HOUR)
    other, other_key = clock.wait(HOUR)
    assert key == other_key
    loop = asyncio.get_running_loop()
    assert _live_timers(loop) == 1  # one timer for the tick, however many wait on it
    clock.forget(key, hold)
    assert _live_timers(loop) == 1  # `other` still waits
    clock.forget(other_key, other)
    assert _live_timers(loop) == 0


# --- the reader's pace (Coalescer.pace): a read a window, just before the window's piece ---


async def test_a_reader_paced_to_the_window_wakes_before_its_piece_is_handed_over() -> None:
    """What the reader reads as it wakes goes in the piece of that very tick, not the next
    one: a tick wakes its readers before its coalescers."""
    pieces = Pieces()
    coalescer = Coalescer(0.02, pieces.emit)
    coalescer.push("a")
    await pieces.next()  # at once; the coalescer now waits for its window's tick
    coalescer.push("b")
    await asyncio.sleep(0)
    await coalescer.pace()
    assert pieces.got == [(0, "a")]  # the window's piece is not handed over yet
    coalescer.push("c")  # what the reader read as it woke
    await pieces.next()
    assert pieces.got == [(0, "a"), (1, "bc")]  # in that tick's piece
    await coalescer.close()


async def test_a_reader_paces_to_the_tick_its_coalescer_waits_for() -> None:
    """Late in a window, the reader waits for that window's tick (not the next one, half a
    window on): no token read later than its piece is handed over. A window of a second:
    the check below tells the two ticks apart by half a window, which a loaded machine's
    late wake-up (200 ms, seen in a full suite on 2 cores) must not blur."""
    window = 1.0
    pieces = Pieces()
    coalescer = Coalescer(window, pieces.emit)
    coalescer.push("a")
    await pieces.next()
    await asyncio.sleep(0)
    assert coalescer._hold is not None and coalescer._tick is not None
    loop = asyncio.get_running_loop()
    tick_at = (coalescer._tick[1] + coalescer._clock._phase) * window
    await asyncio.sleep(max(tick_at - loop.time() - window / 5, 0))  # less than half a window before it
    coalescer.push("b")
    await coalescer.pace()
    assert loop.time() < tick_at + window / 2  # woken at its coalescer's tick
    assert pieces.got == [(0, "a")]
    await coalescer.close()


def test_a_reader_does_not_wait_without_a_window_or_after_close() -> None:
    async def go() -> None:
        for window, closed in ((0.0, False), (HOUR, True)):
            pieces = Pieces()
            coalescer = Coalescer(window, pieces.emit)
            coalescer.push("a")
            if closed:
                await coalescer.close()
            step = coalescer.pace().__await__()
            with pytest.raises(StopIteration):  # returns without suspending
                step.send(None)
            await coalescer.close()

    asyncio.run(go())


async def test_a_cancelled_reader_leaves_no_timer() -> None:
    pieces = Pieces()
    coalescer = Coalescer(HOUR, pieces.emit)
    coalescer.push("a")
    await pieces.next()
    await asyncio.sleep(0)  # the coalescer waits for its tick
    loop = asyncio.get_running_loop()

    async def read() -> None:
        await coalescer.pace()

    reader = loop.create_task(read())
    await asyncio.sleep(0)
    assert not reader.done()
    await coalescer.close()  # the coalescer no longer waits: the tick is the reader's alone
    assert _live_timers(loop) == 1
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert _live_timers(loop) == 0
