"""Two replies streaming side by side at 750 tokens/s each, as the reader sees them: the
text grows on the page smoothly, in small steps about once per frame window, never in
bunches (asserted: SMOOTH_MEDIAN_GAP_MS, SMOOTH_LARGEST_STEP_SHARE). The page's long tasks
(PerformanceObserver 'longtask': main-thread work over 50 ms) and its frames per second
(requestAnimationFrame callbacks over the streaming window) are measured in the browser
and printed, not asserted (they follow the machine's load);
docs/benchmarks/2026-12-03.md#b-browser records them. Their target is no long task over
50 ms."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from tests.browser.conftest import SIM_TPS, finished, open_room, screenshot, send

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(180)]

# Installed before the post: counts animation frames and collects long tasks; stops at
# the moment both replies have ended (the second final article).
MEASURE = """(replies) => {
  const m = window.__measure = {frames: 0, longtasks: [], start: performance.now(), first: null, end: null,
                                supported: PerformanceObserver.supportedEntryTypes.includes('longtask')};
  const seq = Math.max(0, ...[...document.querySelectorAll('article')].map(a => Number(a.dataset.seq)));
  new PerformanceObserver(list => {
    for (const e of list.getEntries()) if (m.end === null) m.longtasks.push({start: e.startTime, ms: e.duration});
  }).observe({type: 'longtask'});
  const mine = () => [...document.querySelectorAll('article[data-role=assistant]')].filter(a => Number(a.dataset.seq) > seq);
  // [time, characters] at each animation frame where what the reader sees of the replies
  // (their formatted views) grew, and by how much.
  m.shown = [];
  const seen = new Map();
  const frame = () => {
    if (m.end !== null) return;
    m.frames++;
    let grew = 0;
    for (const a of mine()) {
      const view = a.querySelector('.live');
      const n = view ? view.textContent.length : 0, before = seen.get(a.id) || 0;
      if (n > before) { grew += n - before; seen.set(a.id, n); }
    }
    if (grew) m.shown.push([performance.now(), grew]);
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
  // An article's end lands replaced whole (a child of #messages) or as its status
  // attribute: one observer for each, neither woken by the streaming text itself.
  const observers = [];
  const check = () => {
    const mine = [...document.querySelectorAll('article[data-role=assistant]')].filter(a => Number(a.dataset.seq) > seq);
    if (m.first === null && mine.length) m.first = performance.now();
    if (m.end === null && mine.filter(a => a.dataset.status !== 'streaming').length >= replies) {
      m.end = performance.now();
      observers.forEach(o => o.disconnect());
    }
  };
  const messages = document.getElementById('messages');
  observers.push(new MutationObserver(check), new MutationObserver(check));
  observers[0].observe(messages, {childList: true});
  observers[1].observe(messages, {subtree: true, attributeFilter: ['data-status']});
}"""


# While the replies stream, the text the reader sees grows on the page about once per
# frame window (COLLAB_COALESCE_MS, 30 ms): measured (load 4.5-7.8, 4 runs) a median
# 32-33 ms between animation frames that showed more text, p90 35-37 ms, longest 84-91
# ms; with the window at 250 ms (a stream bunched into four pieces a second) a median of
# 250 ms. The bound leaves room for a loaded machine and fails a stream that comes in
# bunches (a median over 100 ms). The longest pause is printed, not asserted: beside a
# test suite on two cores it passed 500 ms once (524) with nothing wrong on the page. A
# stream that stops mid-way and then lands at once fails on its size instead: no single
# step may show more than a quarter of the text.
SMOOTH_MEDIAN_GAP_MS = 100.0
SMOOTH_LARGEST_STEP_SHARE = 0.25


def test_two_replies_at_750_tokens_per_second(chromium: Any, site: Any) -> None:
    page = open_room(chromium, site, "alice", viewport={"width": 1280, "height": 800})
    page.evaluate(MEASURE, 2)
    before = page.locator("article[data-role=assistant]:not([data-status=streaming])").count()
    send(page, "@long1 @long2 write at length, both of you")
    finished(page, before + 2, timeout=60_000)
    page.wait_for_function("() => window.__measure.end !== null")
    m = page.evaluate("window.__measure")
    stats = page.evaluate("window.collabStats || null")
    tokens = page.evaluate(
        "() => [...document.querySelectorAll('article[data-role=assistant]')].slice(-2).map(a => Number(a.dataset.tokens))"
    )
    seconds = (m["end"] - m["first"]) / 1000
    fps = m["frames"] / ((m["end"] - m["start"]) / 1000)
    longest = max((t["ms"] for t in m["longtasks"]), default=0.0)
    report = {
        "streams": 2,
        "tokens_per_s_each": SIM_TPS,
        "tokens": tokens,
        "stream_seconds": round(seconds, 2),
        "fps": round(fps, 1),
        "longtasks": len(m["longtasks"]),
        "longtask_max_ms": round(longest, 1),
        "longtask_ms": [round(t["ms"], 1) for t in m["longtasks"]],
        "longtask_at_ms": [round(t["start"] - m["first"]) for t in m["longtasks"]],
        "collab_js": stats,
    }
    times = [at for at, _ in m["shown"]]
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    steps = sorted(chars for _, chars in m["shown"])
    report["updates"] = len(times)
    if gaps:
        quantiles = [gaps[int(len(gaps) * q)] for q in (0.5, 0.9, 0.99)] + [gaps[-1]]
        report["update_gap_ms_p50_p90_p99_max"] = [round(ms, 1) for ms in quantiles]
        report["update_chars_p50_max"] = [steps[len(steps) // 2], steps[-1]]
    print("BROWSER-SMOOTHNESS " + json.dumps(report))
    screenshot(page, "room-two-long-replies")
    assert m["supported"], "this Chromium reports no long tasks"
    assert len(gaps) >= 20, f"the replies' text grew on the page in {len(times)} animation frames only"
    median = gaps[len(gaps) // 2]
    assert median <= SMOOTH_MEDIAN_GAP_MS, f"the text grew every {median:.0f} ms (median): bunched"
    total = sum(steps)
    assert steps[-1] <= SMOOTH_LARGEST_STEP_SHARE * total, f"{steps[-1]} of {total} characters shown at once"
