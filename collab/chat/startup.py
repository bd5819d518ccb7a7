"""What a server process does as soon as it runs, before its first socket: start its
background work (collab/chat/lifecycle.py), its render workers, and set its garbage
collector for a long-lived streaming process."""

from __future__ import annotations

import gc
import sys

from collab.chat import lifecycle, render_pool


def start_with_server() -> None:
    """Under Daphne, start the background work (and its first sweep) as soon as the
    server runs, not at its first socket: a process that restarts after a crash finishes
    what it left behind even if nobody connects to it."""
    if "twisted.internet.reactor" not in sys.modules:
        return
    from twisted.internet import reactor

    # "When running" fires just before the asyncio loop runs: start one turn later, inside it.
    reactor.callWhenRunning(lambda: reactor.callLater(0, lifecycle.runtime.ensure_started))  # type: ignore[attr-defined,arg-type]
    # The render workers too: each imports its lexers (~0.6 s of CPU) once, at start, not
    # while the first posts wait for their HTML (docs/benchmarks/2026-12-05.md#b-quiet-before-after).
    reactor.callWhenRunning(render_pool.pool)  # type: ignore[attr-defined]
    reactor.callWhenRunning(freeze_startup_heap)  # type: ignore[attr-defined]


# The youngest generation is collected once this many more container objects were made than
# freed (CPython's default: 700). A streaming process holds thousands alive at any instant
# (each read's chunks, each window's frames), so at 700 it is collected many times a second,
# promoting what was merely in flight into the older generations and their long walks;
# at 10,000 far less often (docs/benchmarks/2026-12-04.md#b-young-gc).
YOUNG_GC_THRESHOLD = 10_000


def freeze_startup_heap() -> None:
    """Out of the cyclic garbage collector's sight: everything alive once the server is up
    (Django, the modules, the settings), which a full collection would otherwise walk
    with the event loop stopped; it walks only what the running server made
    (docs/benchmarks/2026-12-03.md#b-gc-freeze). Then the
    young generation's threshold is raised (YOUNG_GC_THRESHOLD)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])
