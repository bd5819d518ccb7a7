"""The page honours the server's retry hint (docs/wire.md, "4429, come back later"): a
site that admits one socket per 4 s, its one token taken by another tab of alice's, so
the page's first socket is closed 4429 with `retry=MS`; the page connects again no
earlier than MS after that close, once (not also on htmx's own back-off), and gets its
snapshot. Times are the page's own (performance.now() in its event listeners)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.sync.client import connect
from websockets.typing import Origin

from tests.browser.conftest import Site, running_site

# Every socket event of the page, in order, with its time (ms, performance.now()).
RECORD = """
window.socketEvents = [];
["htmx:wsConnecting", "htmx:wsOpen", "htmx:wsClose", "htmx:wsAfterMessage"].forEach(function (type) {
  document.addEventListener(type, function (e) {
    var ev = e.detail && e.detail.event;
    window.socketEvents.push({type: type.slice(7), at: performance.now(),
                              code: ev ? ev.code : null, reason: ev ? ev.reason : null});
  });
});
"""


@pytest.fixture(scope="module")
def tight_site(browser_sim: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    with running_site(browser_sim, tmp_path_factory, COLLAB_CONNECT_RATE="0.25") as site:  # burst 1
        yield site


def test_the_page_waits_the_hint_then_gets_its_snapshot(chromium: Any, tight_site: Site) -> None:
    site = tight_site
    cookie = site.cookie("alice")
    ws_url = site.url.replace("http://", "ws://") + "/ws/rooms/lab/"
    with connect(ws_url, origin=Origin(site.url), additional_headers={"Cookie": f"sessionid={cookie}"}) as other:
        assert 'id="members"' in str(other.recv(timeout=30))  # admitted: the bucket's token is taken
    context = chromium.new_context()
    host = site.url.split("//", 1)[1].split(":")[0]
    context.add_cookies([{"name": "sessionid", "value": cookie, "domain": host, "path": "/"}])
    page = context.new_page()
    page.add_init_script(RECORD)
    try:
        page.goto(f"{site.url}/r/lab/")
        # Open again after a 4429, and a frame (the snapshot) on that socket.
        page.wait_for_function(
            """() => { const ev = window.socketEvents, i = ev.findIndex(e => e.type === "Close" && e.code === 4429);
                       return i >= 0 && ev.slice(i).some(e => e.type === "AfterMessage"); }""",
            timeout=60_000,
        )
        page.wait_for_selector("#conn.ok")
        events: list[dict[str, Any]] = page.evaluate("window.socketEvents")
    finally:
        context.close()
    closes = [i for i, e in enumerate(events) if e["type"] == "Close"]
    first = events[closes[0]]
    assert first["code"] == 4429, events
    assert events[: closes[0]] == [e for e in events[: closes[0]] if e["type"] in ("Connecting", "Open")]
    for i in closes:
        close = events[i]
        assert close["code"] == 4429, events  # only the hint closed this page's sockets
        found = re.fullmatch(r"retry=(\d+)", close["reason"] or "")
        assert found, close
        hint = int(found[1])
        after = events[i + 1 :]
        reconnect = after[0]  # the next event: the page connecting again
        assert reconnect["type"] == "Connecting", events
        # Not before the hint: the page waits MS + random() * MS (the 1 ms: performance.now()'s
        # coarsened resolution, on both readings).
        assert reconnect["at"] - close["at"] >= hint - 1, (hint, close, reconnect)
    # The last socket stayed open and got its snapshot.
    last_open = max(i for i, e in enumerate(events) if e["type"] == "Open")
    assert last_open > closes[-1]
    assert any(e["type"] == "AfterMessage" for e in events[last_open:])
    # One connect per close (the page's after the hint; none of htmx's own besides), and the first.
    assert sum(e["type"] == "Connecting" for e in events) == len(closes) + 1, events
