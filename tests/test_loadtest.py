"""The load generator: its pieces on their own, and a short `loadtest --scenario one-room`
end to end through the real command (simulator, Daphne and Locust as processes).

The end-to-end run asserts what the run must deliver (every WIRE.md report key, the
integrity figures at zero, replies completed), never how fast the machine is.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from collab.loadtest.report import LATENCY_KEYS, REPORT_KEYS, knee_of, passes
from collab.loadtest.stats import Collector, Histogram, percentiles
from collab.loadtest.wire import parse_frame, words_of_html, words_of_text
from collab.loadtest.wsclient import ConnectionClosed, WebSocket
from collab.simulator.text import simulated_tokens, split_tokens

ROOT = Path(__file__).resolve().parent.parent


# --- pieces ------------------------------------------------------------------------------------


def test_split_tokens_gives_back_the_simulators_tokens() -> None:
    rng = random.Random(4)
    for k in range(300):
        messages = [{"role": "user", "content": f"question {k} {rng.random()}"}]
        n = rng.choice([1, 3, 11, 12, 40, 120, 750])
        tokens = simulated_tokens(messages, seed=k % 5, n=n)
        assert split_tokens("".join(tokens)) == tokens
        cut = rng.randint(0, n)  # a prefix ending on a token boundary, as a streamed piece does
        assert split_tokens("".join(tokens[:cut])) == tokens[:cut]


def test_histogram_percentiles_and_merge() -> None:
    a, b = Histogram(), Histogram()
    a.extend(float(v) for v in range(1, 51))
    b.extend(float(v) for v in range(51, 101))
    a.merge(b)
    p = percentiles(a)
    assert (p["p50"], p["p95"], p["p99"], p["max"], p["count"]) == (50.0, 95.0, 99.0, 100.0, 100)
    assert percentiles(a, shift=10.0)["p50"] == 40.0
    assert percentiles(Histogram())["p99"] is None
    again = Histogram.from_json(json.loads(json.dumps(a.to_json())))
    assert again.counts == a.counts and again.n == a.n


def test_collector_round_trip_and_merge() -> None:
    one, two = Collector(), Collector()
    one.add("lag_ms", 3.0)
    one.count("chars_lost", 2)
    one.error("rate.limited")
    one.window = [10.0, 20.0]
    two.add("lag_ms", 5.0)
    two.window = [12.0, 25.0]
    two.cpu["w1"] = [1.0, 10.0]
    merged = Collector.from_json(json.loads(json.dumps(one.to_json())))
    merged.merge(two)
    assert merged.hists["lag_ms"].n == 2
    assert merged.counts["chars_lost"] == 2 and merged.error_codes == {"rate.limited": 1}
    assert merged.window == [10.0, 25.0]
    assert merged.generator_cpu_percent() == 10.0


def test_parse_frames() -> None:
    delta = parse_frame(b'<div id="msg-7-body" hx-swap-oob="beforeend" data-offset="12"> a &lt;b&gt;</div>')
    assert delta.kind == "delta"
    (piece,) = delta.pieces
    assert (piece.msg, piece.offset, piece.text, piece.end) == (7, 12, " a <b>", 18)
    new = parse_frame(
        b'<div id="messages" hx-swap-oob="beforeend">'
        b'<article id="msg-8" data-seq="3" data-role="user" data-author="u" data-status="done">'
        b'<div id="msg-8-body" class="body md"><p>@bot lt0123456789abcdef hi</p></div></article>'
        b'<article id="msg-9" data-seq="4" data-role="assistant" data-author="Bot" data-status="streaming">'
        b'<div id="msg-9-body" class="body raw"></div></article></div>'
    )
    assert new.kind == "new" and new.nonce == "lt0123456789abcdef"
    assert [(a.msg, a.role, a.status) for a in new.articles] == [(8, "user", "done"), (9, "assistant", "streaming")]
    final = parse_frame(
        b'<article id="msg-9" data-seq="4" data-role="assistant" data-author="Bot" data-status="done" '
        b'data-tokens="5" hx-swap-oob="true"><div id="msg-9-body" class="body md">'
        b"<h2>Title</h2><p>Some <code>send()</code> text</p></div></article>"
    )
    assert final.kind == "final" and final.articles[0].attrs["data-tokens"] == "5"
    assert final.final_words() == words_of_text("## Title\n\nSome `send()` text")
    assert words_of_html("<pre><code class='language-python'>x = 1</code></pre>") == []
    error = parse_frame(
        b'<div id="errors" hx-swap-oob="beforeend"><p class="error" data-code="rate.limited">Slow</p></div>'
    )
    assert error.kind == "error" and error.errors == [("rate.limited", "Slow")]


def _ws_frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        return head + bytes([n]) + payload
    if n < 65536:
        return head + bytes([126]) + n.to_bytes(2, "big") + payload
    return head + bytes([127]) + n.to_bytes(8, "big") + payload


def test_websocket_client_reads_frames_split_anyhow() -> None:
    server, client = socket.socketpair()
    ws = WebSocket(client)
    big = b"x" * 70_000
    stream = (
        _ws_frame(0x1, b"one")
        + _ws_frame(0x1, b"t" * 300)
        + _ws_frame(0x1, b"fra", fin=False)
        + _ws_frame(0x0, b"gment")
        + _ws_frame(0x2, big)
        + _ws_frame(0x8, (1000).to_bytes(2, "big"))
    )

    def feed() -> None:
        for i in range(0, len(stream), 777):  # arbitrary cuts through headers and payloads
            server.sendall(stream[i : i + 777])

    writer = threading.Thread(target=feed)
    writer.start()
    got: list[bytes] = []
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            got += ws.recv_messages()
    writer.join()
    assert got == [b"one", b"t" * 300, b"fragment", big]
    assert closed.value.code == 1000
    ws.close()
    server.close()


def test_knee_is_the_highest_passing_level() -> None:
    def step(replies: float, p99: float, lost: int = 0) -> dict[str, Any]:
        return {
            "params": {"concurrent_replies": replies, "members_total": int(replies * 10)},
            "delivery_lag_ms": {"p99": p99},
            "chars_lost": lost,
            "chars_duplicated": 0,
            "chars_out_of_order": 0,
            "replies_failed": 0,
            "replies_completed": 5,
            "details": {"final_mismatch": 0},
        }

    steps = [step(4, 20.0), step(8, 60.0), step(16, 90.0, lost=3), step(24, 150.0)]
    assert passes(steps[1]) and not passes(steps[2])
    assert knee_of(steps) == {"concurrent_replies": 8, "members": 80}
    assert knee_of([step(1, 500.0)]) is None


# --- the whole command -----------------------------------------------------------------------


@pytest.mark.loadtest
@pytest.mark.timeout(600)
def test_one_room_run_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    cmd = [
        sys.executable,
        str(ROOT / "manage.py"),
        "loadtest",
        "--scenario",
        "one-room",
        "--members",
        "3",
        "--duration",
        "4",
        "--reply-tokens",
        "200",
        "--offered",
        "1",
        "--json",
        str(out),
        "--keep",
        str(tmp_path / "run"),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=540, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())

    for key in REPORT_KEYS:
        assert key in report, key
    assert report["scenario"] == "one-room"
    params = report["params"]
    assert params["members_total"] == 3 and params["tps"] == 750 and params["coalesce_ms"] == 30
    for key in LATENCY_KEYS:
        entry = report[key]
        assert set(entry) >= {"p50", "p95", "p99", "max"}, key
        assert all(isinstance(entry[q], int | float) for q in ("p50", "p95", "p99", "max")), (key, entry)
        assert entry["p50"] <= entry["p95"] <= entry["p99"] <= entry["max"], (key, entry)

    # Integrity: every member got every character of every reply, once and in order.
    assert report["chars_lost"] == 0
    assert report["chars_duplicated"] == 0
    assert report["chars_out_of_order"] == 0
    assert report["replies_completed"] > 0
    assert report["replies_failed"] == 0
    assert report["errors"] == 0, report["details"]["error_codes"]
    assert report["details"]["final_mismatch"] == 0
    assert report["details"]["tokens_mismatch"] == 0
    assert report["details"]["member_replies"] == 3 * report["replies_completed"]

    assert report["member_ttft_ms"]["count"] == report["details"]["member_replies"]
    assert report["model_ttft_ms"]["count"] > 0
    assert report["frames_per_s"] > 0 and report["deliveries_per_s"] >= report["frames_per_s"]
    for key in ("server_cpu_percent", "server_rss_mb", "generator_cpu_percent"):
        assert isinstance(report[key], int | float) and report[key] >= 0, key
    assert report["server_rss_mb"] > 0
