"""The load generator: its pieces on their own, and a short `loadtest --scenario one-room`
end to end through the real command (simulator, Daphne and Locust as processes).

The end-to-end runs assert what the run must deliver (every docs/wire.md report key, the
integrity figures at zero, replies completed; with ``--processes 2`` the members of one
room spread over two server processes and Redis' commands per reply), never how fast
the machine is.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import random
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from collab.loadtest.config import RunConfig
from collab.loadtest.frames import Frames
from collab.loadtest.report import LATENCY_KEYS, REPORT_KEYS, knee_of, passes, summary, table
from collab.loadtest.room import Post, RoomRun
from collab.loadtest.route import Ring, room_path
from collab.loadtest.sampler import REDIS, Counters, Sampler, level_resources, loop_lag, receptions_per_frame
from collab.loadtest.stats import Collector, Histogram, percentiles
from collab.loadtest.wire import not_escaped, parse_frame, words_of_html, words_of_text
from collab.loadtest.wsclient import ConnectionClosed, HandshakeError, WebSocket
from collab.simulator.text import simulated_tokens, split_tokens
from tests.conftest import require_redis

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


# --- the integrity checkers, fed faults on purpose -----------------------------------------------
#
# Both checkers (frames.Frames, what the tests read the wire with; room.RoomRun, the load
# generator's) are fed the same reply as synthetic frames: once cleanly, and once each
# with one fault, and must count exactly the characters of that fault.

PIECES = ["Tom & Jerry ", "say <hi> ", "to you ", "and me."]
REPLY = "".join(PIECES)
STARTS = [sum(len(p) for p in PIECES[:i]) for i in range(len(PIECES))]
OVERLAP = 3  # the overlapping piece repeats the last 3 characters of piece 1
FINAL_BODY = "<p>Tom &amp; Jerry say &lt;hi&gt; to you and me.</p>"


def delta_frame(index: int, escape: bool = True) -> str:
    text = PIECES[index]
    return (
        f'<div id="msg-9-body" hx-swap-oob="beforeend" data-offset="{STARTS[index]}">'
        f"{html.escape(text) if escape else text}</div>"
    )


def overlap_frame() -> str:
    """Piece 2, starting OVERLAP characters early (it repeats the end of piece 1)."""
    offset = STARTS[2] - OVERLAP
    text = html.escape(REPLY[offset : STARTS[3]])
    return f'<div id="msg-9-body" hx-swap-oob="beforeend" data-offset="{offset}">{text}</div>'


# (stream of frames, (lost, duplicated, out of order) in characters)
STREAMS: dict[str, tuple[list[str], tuple[int, int, int]]] = {
    "clean": ([delta_frame(i) for i in (0, 1, 2, 3)], (0, 0, 0)),
    "gap": ([delta_frame(i) for i in (0, 2, 3)], (len(PIECES[1]), 0, 0)),
    "repeat": ([delta_frame(i) for i in (0, 1, 1, 2, 3)], (0, len(PIECES[1]), 0)),
    "overlap": ([delta_frame(0), delta_frame(1), overlap_frame(), delta_frame(3)], (0, OVERLAP, 0)),
    "out of order": ([delta_frame(i) for i in (0, 2, 1, 3)], (0, 0, len(PIECES[2]))),
    "two out of order": ([delta_frame(i) for i in (0, 3, 2, 1)], (0, 0, len(PIECES[2]) + len(PIECES[3]))),
}


@pytest.mark.parametrize("fault", list(STREAMS))
def test_frames_count_exactly_the_characters_lost_repeated_or_out_of_order(fault: str) -> None:
    stream, expected = STREAMS[fault]
    frames = Frames()
    for frame in stream:
        frames.feed(frame)
    reply = frames.replies[9]
    assert (reply.lost, reply.duplicated, reply.out_of_order) == expected
    assert reply.unescaped == 0
    # What the client was shown in order: all of it, less the gap's piece (and what follows it).
    assert reply.text == (REPLY[: STARTS[1]] if fault == "gap" else REPLY)


def run_room(streams: list[list[str]]) -> Collector:
    """One reply to one post in a room of len(streams) members, member i reading streams[i]
    (the post, the pieces, the reply's end) through the load generator's checker."""
    room = {"slug": "r", "users": [{"username": f"u{i}", "password": "pw"} for i in range(len(streams))]}
    room["assistants"] = ["bot"]
    collector = Collector()
    run = RoomRun(RunConfig(target="http://127.0.0.1:1", rooms=[room]), room, collector)
    nonce = "lt0123456789abcdef"
    run.posts[nonce] = Post(nonce, at=0.0, poster=0, mentions=1)
    new = (
        '<div id="messages" hx-swap-oob="beforeend">'
        '<article id="msg-8" data-seq="1" data-role="user" data-author="u0" data-status="done">'
        f'<div id="msg-8-body" class="body md"><p>@bot {nonce} hi</p></div></article>'
        '<article id="msg-9" data-seq="2" data-role="assistant" data-author="BOT" data-status="streaming">'
        '<div id="msg-9-body" class="body raw"></div></article></div>'
    )
    final = (
        '<article id="msg-9" data-seq="2" data-role="assistant" data-author="BOT" data-status="done" '
        f'data-tokens="8" hx-swap-oob="true"><div id="msg-9-body" class="body md">{FINAL_BODY}</div></article>'
    )
    for c in run.conns:
        c.alive = True
    now = 1.0
    for c in run.conns:
        run._on_frame(c, new.encode(), now)
    assert run.pending_finals == {9: {c.index for c in run.conns}}
    for c, stream in zip(run.conns, streams, strict=True):
        for frame in stream:
            now += 0.01
            run._on_frame(c, frame.encode(), now)
    for c in run.conns:
        run._on_frame(c, final.encode(), now + 0.01)
    assert not run.pending_finals  # judged
    return collector


@pytest.mark.parametrize("fault", list(STREAMS))
def test_loadtest_checker_counts_exactly_the_characters_lost_repeated_or_out_of_order(fault: str) -> None:
    stream, expected = STREAMS[fault]
    clean = STREAMS["clean"][0]
    counts = run_room([clean, stream, clean]).counts
    assert (counts.get("chars_lost", 0), counts.get("chars_duplicated", 0), counts.get("chars_out_of_order", 0)) == (
        expected
    )
    assert counts["replies_completed"] == 1 and counts["member_replies"] == 3
    # A member shown the whole text in the end matches the final article; one with a gap does not.
    assert counts.get("final_mismatch", 0) == (1 if fault == "gap" else 0)
    assert counts.get("errors", 0) == 0


def test_not_escaped_counts_what_html_escaping_would_have_changed() -> None:
    assert not_escaped(html.escape("Tom & Jerry say <hi> 'x' \"y\" &amp; &#39;")) == 0
    assert not_escaped("&lt;b&gt; &amp; &#39; &#x27; &nbsp; &hellip;") == 0
    assert not_escaped("<b>") == 2
    assert not_escaped("Tom & Jerry") == 1
    assert not_escaped("&amp") == 1  # no semicolon: not a reference
    assert not_escaped("a > b &# c") == 2
    assert not_escaped(b"a > b &# c &amp;") == 2  # the same on the bytes of a frame


def test_both_checkers_flag_a_piece_that_is_not_escaped() -> None:
    """A piece whose TEXT went out unescaped (`<hi>` as a tag, a bare `&`) reads back as the
    same characters once unescaped: only checking the frame as sent sees it."""
    stream = [delta_frame(0, escape=False), delta_frame(1, escape=False), delta_frame(2), delta_frame(3)]
    frames = Frames()
    for frame in stream:
        frames.feed(frame)
    reply = frames.replies[9]
    assert reply.text == REPLY  # unescaping alone cannot tell
    assert reply.unescaped == 3  # "&", "<", ">"
    assert (reply.lost, reply.duplicated, reply.out_of_order) == (0, 0, 0)
    assert parse_frame(delta_frame(1, escape=False).encode()).unescaped == 2
    assert parse_frame(delta_frame(1).encode()).unescaped == 0
    collector = run_room([STREAMS["clean"][0], stream])
    assert collector.error_codes == {"piece.unescaped": 3}  # once per distinct frame, not per member
    snapshot = (
        '<div id="messages" hx-swap-oob="true"><article id="msg-9" data-seq="2" data-role="assistant" '
        'data-author="BOT" data-status="streaming" data-length="12"><div id="msg-9-body" class="body raw">'
        "Tom & Jerry </div></article></div>"
    )
    frames = Frames()
    frames.feed(snapshot)
    assert (frames.replies[9].text, frames.replies[9].unescaped, frames.replies[9].lost) == ("Tom & Jerry ", 1, 0)


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


def _client_frame(data: bytes) -> tuple[int, bytes, bytes]:
    """The opcode and payload of one short masked client frame, and what follows it."""
    length = data[1] & 0x7F
    assert data[1] & 0x80 and length < 126  # a client masks; these are all short
    mask, payload = data[2:6], data[6 : 6 + length]
    return data[0] & 0x0F, bytes(b ^ mask[i % 4] for i, b in enumerate(payload)), data[6 + length :]


def _serve_once(answer: Any) -> tuple[str, threading.Thread, dict[str, Any]]:
    """A listening socket whose one connection `answer(conn, request_head, seen)` handles."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: dict[str, Any] = {}

    def run() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            answer(conn, head.decode("latin-1"), seen)

    thread = threading.Thread(target=run)
    thread.start()
    return f"ws://127.0.0.1:{listener.getsockname()[1]}/ws/rooms/lab/", thread, seen


def test_websocket_client_handshake_frames_in_the_same_read_ping_and_close_code() -> None:
    def answer(conn: socket.socket, head: str, seen: dict[str, Any]) -> None:
        seen["head"] = head
        key = re.search(r"Sec-WebSocket-Key: (\S+)", head)
        assert key is not None
        accept = base64.b64encode(
            hashlib.sha1((key.group(1) + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
        )
        upgrade = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        # The answer, the snapshot and a ping in one write: one read may hold them all.
        conn.sendall(
            upgrade
            + b"Sec-WebSocket-Accept: "
            + accept
            + b"\r\n\r\n"
            + _ws_frame(0x1, b"snapshot")
            + _ws_frame(0x9, b"hi")
        )
        data = b""
        while len(data) < 8:  # the pong: 2 + 4 (mask) + 2 bytes
            data += conn.recv(4096)
        seen["pong"] = _client_frame(data)[:2]
        conn.sendall(_ws_frame(0x1, b"last") + _ws_frame(0x8, (4403).to_bytes(2, "big")))
        data = b""
        while len(data) < 8:  # the close frame's echo
            data += conn.recv(4096)
        seen["close"] = _client_frame(data)[:2]

    url, thread, seen = _serve_once(answer)
    ws = WebSocket.connect(url, {"Cookie": "sessionid=abc", "Origin": "http://127.0.0.1"})
    ws.sock.settimeout(10)  # a frame lost on the way fails the test instead of hanging it
    got = ws.recv_messages()
    assert got == [b"snapshot"]
    assert ws.recv_messages() == [b"last"]  # the frame before the close frame comes first
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv_messages()
    assert closed.value.code == 4403
    thread.join(10)
    assert "Cookie: sessionid=abc" in seen["head"] and "Origin: http://127.0.0.1" in seen["head"]
    assert seen["pong"] == (0xA, b"hi")
    assert seen["close"] == (0x8, (4403).to_bytes(2, "big"))
    ws.close()


def test_websocket_client_reports_a_refused_handshake() -> None:
    def answer(conn: socket.socket, head: str, seen: dict[str, Any]) -> None:
        conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")

    url, thread, _ = _serve_once(answer)
    with pytest.raises(HandshakeError) as refused:
        WebSocket.connect(url)
    thread.join(10)
    assert refused.value.status == 403


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


def test_members_of_a_room_spread_over_the_server_processes() -> None:
    room = {"slug": "r", "users": [{"username": f"u{i}", "password": "pw"} for i in range(5)], "assistants": ["a"]}
    targets = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    cfg = RunConfig(target=targets[0], targets=targets, rooms=[room], sockets_per_member=2)
    run = RoomRun(cfg, room, Collector())
    # Member i (and each of its tabs) on process i mod 2.
    assert [(c.username, c.server) for c in run.conns] == [(f"u{i}", i % 2) for i in range(5) for _tab in range(2)]
    assert [cfg.target_of(c.server) for c in run.conns[:4]] == [targets[0], targets[0], targets[1], targets[1]]
    alone = RunConfig(target=targets[0], rooms=[room])
    assert {c.server for c in RoomRun(alone, room, Collector()).conns} == {0}
    assert alone.target_of(alone.server_of(3)) == targets[0]


def test_hashed_rooms_keep_their_members_on_one_process_and_spread_over_processes() -> None:
    targets = [f"http://127.0.0.1:{p}" for p in (8001, 8002, 8003)]
    rooms: list[dict[str, Any]] = [
        {"slug": f"room-{n}", "users": [{"username": f"u{n}-{i}", "password": "pw"} for i in range(4)]}
        for n in range(30)
    ]
    cfg = RunConfig(target=targets[0], targets=targets, rooms=rooms, route="hash", sockets_per_member=2)
    placed: dict[str, int] = {}
    for room in rooms:
        servers = {c.server for c in RoomRun(cfg, room, Collector()).conns}
        assert len(servers) == 1, (room["slug"], servers)  # every member and tab of a room: one process
        placed[room["slug"]] = servers.pop()
        assert placed[room["slug"]] == Ring(targets).server_of(room_path(room["slug"]))  # stable
    assert set(placed.values()) == {0, 1, 2}  # rooms spread over every process
    # Consistent: a process more moves only rooms onto the new one, never between the others.
    more = Ring([*targets, "http://127.0.0.1:8004"])
    moved = {slug for slug, i in placed.items() if more.server_of(room_path(slug)) != i}
    assert moved and all(more.server_of(room_path(slug)) == 3 for slug in moved)
    spread = RunConfig(target=targets[0], targets=targets, rooms=rooms, route="spread")
    assert {c.server for c in RoomRun(spread, rooms[0], Collector()).conns} == {0, 1, 2}


def test_level_resources_sum_the_servers_and_count_redis_commands_per_reply() -> None:
    sampler = Sampler()  # not started: fed by hand
    sampler.watch("server/0", 1, group="server")
    sampler.watch("server/1", 2, group="server")
    for t, (c0, r0), (c1, r1) in [(100.0, (1.0, 50.0), (2.0, 60.0)), (110.0, (3.0, 55.0), (3.0, 61.0))]:
        sample = {"server/0": (c0, r0), "server/1": (c1, r1), "server": (c0 + c1, r0 + r1)}
        sampler.samples.append((t, sample))
    col = Collector()
    col.window = [100.0, 110.0]
    col.count("replies_completed", 4)
    col.count("deliveries", 1000)
    col.count("sockets_server_0", 3)
    col.count("sockets_server_1", 2)
    targets = ["http://a", "http://b"]
    before = Counters(
        at=99.0,
        redis_calls={"publish": 10, "info": 5, "subscribe": 1},
        redis_cpu_s=1.0,
        metrics=[
            {
                "collab_posts_total": 1.0,
                'collab_replies_total{status="done"}': 1.0,
                'collab_frames_total{kind="delta"}': 10.0,
                "collab_room_frames_received_total": 10.0,
            },
            None,
        ],
    )
    # No token counter from the second server (no metrics token): no CPU per token.
    after = Counters(
        at=111.0,
        redis_calls={"publish": 90, "info": 50, "subscribe": 5, "unsubscribe": 4},
        redis_cpu_s=2.2,
        metrics=[
            {
                "collab_posts_total": 4.0,
                'collab_replies_total{status="done"}': 3.0,
                'collab_replies_total{status="error"}': 1.0,
                'collab_frames_total{kind="delta"}': 40.0,
                'collab_frames_total{kind="final"}': 10.0,
                "collab_room_frames_received_total": 30.0,
            },
            None,
        ],
    )
    out = level_resources(sampler, col, {}, targets, before, after)
    assert out["server_cpu_percent"] == 30.0  # (2 + 1) CPU seconds over 10 s
    assert out["server_rss_mb"] == 116.0  # the peak of the sum
    assert out["servers"] == [
        {
            "target": "http://a",
            **{"cpu_percent": 20.0, "rss_mb": 55.0, "sockets": 3, "posts": 3, "replies": 3},
            **{"frames_sent": 40, "frames_received": 20},
        },
        {
            "target": "http://b",
            **{"cpu_percent": 10.0, "rss_mb": 61.0, "sockets": 2, "posts": None, "replies": None},
            **{"frames_sent": None, "frames_received": None},
        },
    ]
    assert out["receptions_per_frame"] is None  # the second server's frames are not known
    assert receptions_per_frame(out["servers"][:1]) == 0.5
    both = [{"frames_sent": 30, "frames_received": 29}, {"frames_sent": 10, "frames_received": 38}]
    assert receptions_per_frame(both) == round(67 / 40, 2)
    # 80 publish + 4 subscribe + 4 unsubscribe over 4 replies; the run's own INFO calls left out.
    assert out["redis_ops_per_reply"] == {"total": 22.0, "publish": 20.0, "subscribe": 1.0, "unsubscribe": 1.0}
    assert out["redis_calls"] == {"publish": 80, "subscribe": 4, "unsubscribe": 4}
    assert out["redis_cpu_level_percent"] == 10.0  # 1.2 CPU seconds over 12 s
    assert out["server_cpu_us_per_delivery"] == 3000.0  # 3 CPU seconds over 1,000 deliveries
    assert out["server_cpu_us_per_token"] is None  # no token counted in the window
    assert out["server_cpu_us_per_token_level"] is None  # no token counter from the second server


def test_cpu_per_token_divides_the_windows_cpu_by_the_tokens_read_in_it() -> None:
    sampler = Sampler()
    sampler.watch("server/0", 1, group="server")
    # The level: members connect (90-100 s), the posting window (100-110 s), the drain (110-130 s).
    for t, cpu in [(90.0, 0.0), (100.0, 1.0), (110.0, 3.0), (130.0, 4.0)]:
        sampler.samples.append((t, {"server/0": (cpu, 50.0), "server": (cpu, 50.0)}))
    col = Collector()
    col.window = [100.0, 110.0]
    col.count("deliveries", 4000)
    col.count("tokens", 10000)
    before = Counters(at=90.0, redis_calls=None, redis_cpu_s=None, metrics=[{"collab_reply_tokens_total": 500.0}])
    after = Counters(at=130.0, redis_calls=None, redis_cpu_s=None, metrics=[{"collab_reply_tokens_total": 16500.0}])
    out = level_resources(sampler, col, {}, ["http://a"], before, after)
    assert out["server_cpu_us_per_delivery"] == 500.0  # 2 CPU seconds over 4,000 deliveries
    assert out["server_cpu_us_per_token"] == 200.0  # the same 2 CPU seconds over 10,000 tokens
    assert out["server_cpu_us_per_token_level"] == 250.0  # 4 CPU seconds over the level's 16,000 tokens


def test_a_redis_restart_in_a_level_reads_as_what_redis_did_since_never_as_negative() -> None:
    sampler = Sampler()
    sampler.watch("server/0", 1, group="server")
    sampler.watch_redis("redis://127.0.0.1:1/0")  # not started: fed by hand
    # Redis had used 50 CPU seconds; it restarts between 104 and 106 s and counts from 0.
    for t, redis_cpu in [(100.0, 50.0), (102.0, 50.5), (104.0, 51.0), (106.0, 0.25), (110.0, 1.25)]:
        sampler.samples.append((t, {"server/0": (t / 100, 50.0), "server": (t / 100, 50.0), REDIS: (redis_cpu, 9.0)}))
    col = Collector()
    col.window = [100.0, 110.0]
    before = Counters(at=100.0, redis_calls={"publish": 900, "ping": 4}, redis_cpu_s=50.0, metrics=[None])
    after = Counters(at=110.0, redis_calls={"publish": 30, "ping": 6}, redis_cpu_s=1.25, metrics=[None])
    out = level_resources(sampler, col, {}, ["http://a"], before, after)
    assert out["redis_cpu_percent"] == 22.5  # 1 s before the restart and 1.25 s after, over 10 s
    assert out["redis_cpu_level_percent"] == 12.5  # only the ends known: the 1.25 s since the restart
    assert out["redis_calls"] == {"publish": 30, "ping": 2}  # publish was reset: its 30 since
    assert sampler.latest(REDIS, seconds=8.0)[0] == 21.875  # 0.5 + 0.25 + 1 over the last 8 s


def test_loop_lag_reads_the_probe_histograms_growth_over_the_level() -> None:
    def hist(counts: dict[str, float]) -> dict[str, float]:
        return {f'collab_event_loop_lag_seconds_bucket{{le="{le}"}}': n for le, n in counts.items()}

    # 100 probes on two servers over the level: 90 within 1 ms, 9 within 5 ms, 1 up to 0.1 s.
    before = [
        hist({"0.001": 10, "0.005": 10, "0.1": 10, "+Inf": 10}),
        hist({"0.001": 0, "0.005": 0, "0.1": 0, "+Inf": 0}),
    ]
    after = [
        hist({"0.001": 60, "0.005": 65, "0.1": 66, "+Inf": 66}),
        hist({"0.001": 40, "0.005": 44, "0.1": 44, "+Inf": 44}),
    ]
    assert loop_lag(before, after) == {"p50": 1.0, "p99": 5.0, "max": 100.0}
    assert loop_lag(before, before) is None  # no probe ran
    assert loop_lag([None], [after[0]]) is None  # a server without its metrics


def test_processes_need_a_redis_layer() -> None:
    with pytest.raises(CommandError, match="needs a Redis channel layer"):
        call_command("loadtest", scenario="one-room", processes=2, layer="memory")
    with pytest.raises(CommandError, match="not with --target"):
        call_command("loadtest", scenario="one-room", processes=2, target="http://x", credentials="c.json")


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
    # The machine's state as the run started: its speed probe, load and CPUs, also printed.
    here = report["machine"]
    assert here["speed_probe_ms"] > 0 and here["cpus"] >= 1
    assert len(here["load_average"]) == 3 and all(x >= 0 for x in here["load_average"])
    assert f"machine: speed probe {here['speed_probe_ms']:g} ms" in proc.stdout
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
    # The server's CPU per unit of work: present, positive, and in the printed table.
    for key in ("server_cpu_us_per_delivery", "server_cpu_us_per_token", "server_cpu_us_per_token_level"):
        assert isinstance(report[key], int | float) and report[key] > 0, (key, report[key])
    # Both per-unit figures are the posting window's CPU: a delivery costs more than a token
    # (a frame carries about 20 of them to each of 3 members).
    assert report["server_cpu_us_per_token"] < report["server_cpu_us_per_delivery"]
    assert "CPU µs/deliv./token" in proc.stdout
    # The server's event-loop lag (its 20 ms probe timer), from its /metrics histogram.
    lag = report["server_loop_lag_ms"]
    assert lag is not None and 0 < lag["p50"] <= lag["p99"] <= lag["max"], lag
    assert "loop lag p50/p99" in proc.stdout


@pytest.mark.loadtest
@pytest.mark.redis
@pytest.mark.timeout(600)
@pytest.mark.parametrize("route", ["spread", "hash"])
def test_two_server_processes_share_each_room(tmp_path: Path, route: str) -> None:
    """One room of 4 on two Daphne processes, each member logged in on another process
    than the one it connects to. Spread: members 0 and 2 on one, 1 and 3 on the other, and
    the Redis layer carries every reply to both, each frame received twice. Hashed: the
    room's four on one process, each frame received once."""
    redis_url = require_redis()
    out = tmp_path / "out.json"
    cmd = [
        sys.executable, str(ROOT / "manage.py"), "loadtest", "--scenario", "one-room",
        "--processes", "2", "--route", route, "--redis", redis_url, "--members", "4", "--duration", "4",
        "--reply-tokens", "200", "--offered", "1", "--json", str(out), "--keep", str(tmp_path / "run"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=540, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    for key in REPORT_KEYS:
        assert key in report, key
    assert report["params"]["processes"] == 2 and report["params"]["layer"] == "pubsub"
    assert report["params"]["route"] == route

    # Integrity, at every member of both processes.
    assert report["chars_lost"] == 0
    assert report["chars_duplicated"] == 0
    assert report["chars_out_of_order"] == 0
    assert report["replies_completed"] > 0
    assert report["replies_failed"] == 0
    assert report["errors"] == 0, report["details"]["error_codes"]
    assert report["details"]["final_mismatch"] == 0
    assert report["details"]["member_replies"] == 4 * report["replies_completed"]

    servers = report["servers"]
    assert len(servers) == 2 and servers[0]["target"] != servers[1]["target"]
    for s in servers:
        assert s["cpu_percent"] > 0 and s["rss_mb"] > 0, s
    assert sum(s["posts"] for s in servers) == report["details"]["posts"]
    assert report["server_cpu_percent"] == pytest.approx(sum(s["cpu_percent"] for s in servers), abs=0.5)
    sent = sum(s["frames_sent"] for s in servers)
    assert sent > 0
    if route == "spread":
        # The members really were on two processes, and both took posts (ran replies)
        # that the members of the other one received: every frame reached both.
        assert [s["sockets"] for s in servers] == [2, 2]
        for s in servers:
            assert s["posts"] > 0 and s["replies"] > 0, s
        assert report["receptions_per_frame"] > 1.5
    else:
        # One process held the room and took every post; the other received no frame of it.
        home = max(servers, key=lambda s: s["sockets"])
        other = servers[1 - servers.index(home)]
        assert [home["sockets"], other["sockets"]] == [4, 0]
        assert home["posts"] == report["details"]["posts"] and other["posts"] == 0
        assert other["frames_received"] == 0
        assert 0.5 < report["receptions_per_frame"] <= 1.0

    # Redis' commands per reply: the layer publishes each frame once to the room's group.
    ops = report["redis_ops_per_reply"]
    assert ops["total"] > 0 and ops["publish"] > 0, ops
    assert ops["total"] == pytest.approx(sum(v for k, v in ops.items() if k != "total"), abs=0.1)
    assert isinstance(report["redis_cpu_percent"], int | float)
    text = summary(report) + table([report])
    assert "server processes: #0" in text and "commands per reply" in text
    assert f"rooms {route}: " in text and "receptions per frame" in text


def test_the_tokens_read_in_the_window_are_each_replys_share_of_its_stream_inside_it() -> None:
    from types import SimpleNamespace

    from collab.loadtest.room_replies import RoomReplies
    from collab.loadtest.room_state import MemberReply

    room = SimpleNamespace(window=[100.0, 110.0])

    def inside(tokens: int, *seen: tuple[float | None, float | None]) -> int:
        states = [(None, MemberReply(first_at=first, final_at=final)) for first, final in seen]
        return RoomReplies._tokens_in_window(room, tokens, states)  # type: ignore[arg-type]

    assert inside(750, (102.0, 103.0), (102.1, 103.2)) == 750  # all of it inside
    assert inside(750, (99.0, 101.0), (99.2, 101.1)) == 375  # half before the window: from the first member's view
    assert inside(750, (109.5, 110.5)) == 375  # half after it (it ended in the drain)
    assert inside(750, (98.0, 99.5)) == 0  # before the window
    assert inside(750, (None, 105.0)) == 750  # no piece seen (a short reply in one frame): its end
    assert inside(750, (None, None)) == 0  # nothing reached any member: nothing to count


def test_a_reply_cut_by_the_runs_end_counts_up_to_its_last_piece() -> None:
    from types import SimpleNamespace

    from collab.loadtest.room_replies import RoomReplies
    from collab.loadtest.room_state import MemberReply

    room = SimpleNamespace(window=[100.0, 110.0])
    # Still streaming when the run ended: no final article; pieces from 108 s to 112 s.
    seen = MemberReply(first_at=108.0, times=[(0, 10, 108.0), (10, 20, 112.0)])
    assert RoomReplies._tokens_in_window(room, 400, [(None, seen)]) == 200  # type: ignore[arg-type, list-item]


@pytest.mark.parametrize(
    "text",
    [
        "Plan:\n```python\ndef split_lines(text):\n    return text\n```\nand then",  # a fence: its info is not shown
        "▸ Step 2 see ```python\ndef split_lines``` here",  # mid-line: a code span, whose "python" is shown
        '  ```json\n{"a": 1}\n```',  # a fence indented by up to 3 spaces
        "cut mid-code:\n```python\ntext[\n\n▸ Step 2\n```python\nx = 1",  # a fence never closed: all code
    ],
)
def test_the_judge_reads_the_words_markdown_shows(text: str) -> None:
    """The agents scenario's judge (agents.same_log) compares a log's streamed words with
    its rendered article's: they agree on what the renderer shows, fences included."""
    from collab.chat.markup import render_markdown

    assert words_of_text(text) == words_of_html(render_markdown(text))
