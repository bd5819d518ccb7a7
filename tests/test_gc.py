"""The server's garbage collector as `startup.freeze_startup_heap` leaves it once the
reactor runs: the start-up heap out of its sight, the young generation collected less
often (docs/benchmarks/2026-12-04.md#b-young-gc)."""

from __future__ import annotations

import gc

from collab.chat.startup import YOUNG_GC_THRESHOLD, freeze_startup_heap


def test_the_start_up_heap_is_frozen_and_the_young_generation_collected_less_often() -> None:
    before = gc.get_threshold()
    gc.unfreeze()
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 0  # what was alive is out of the collector's walks
        assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, before[1], before[2])
        assert before[0] < YOUNG_GC_THRESHOLD
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
