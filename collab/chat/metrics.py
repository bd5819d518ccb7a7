"""Prometheus metrics of this process (GET /metrics, staff or COLLAB_METRICS_TOKEN).

Counted per reply, per frame and per socket, never per member per frame: the
streaming path pays one counter increment per frame at most.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

POSTS = Counter("collab_posts", "Messages posted by members")
REPLIES = Counter("collab_replies", "Replies ended, by final status", ["status"])
REPLIES_STREAMING = Gauge("collab_replies_streaming", "Replies streaming in this process")
REPLY_TTFT = Histogram(
    "collab_reply_ttft_seconds",
    "Model time to first token",
    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30),
)
REPLY_TOKENS = Counter("collab_reply_tokens", "Tokens streamed by replies")
FRAMES = Counter("collab_frames", "Frames broadcast to rooms, by kind", ["kind"])
# One per frame per process that holds a socket of the room (fanout.py's hub): summed over
# the processes and divided by FRAMES, how many processes each frame reached (docs/wire.md).
FRAMES_RECEIVED = Counter("collab_room_frames_received", "Room frames this process received for its sockets")
SOCKETS = Gauge("collab_sockets_open", "Room WebSockets open on this process")
SOCKETS_TOO_SLOW = Counter("collab_sockets_too_slow", "Sockets closed (4408) for falling too far behind")
TYPING = Counter("collab_typing", "Typing notices: broadcast, or dropped (over a member's cap)", ["outcome"])
SNAPSHOT_READS = Counter(
    "collab_snapshot_reads",
    "Snapshots' shared part: read from the database, or shared with another socket of the room",
    ["source"],
)
SOCKETS_RESYNCED = Counter("collab_sockets_resynced", "Snapshots sent again to open sockets that missed frames")
# Observed every 20 ms by a timer (lifecycle.Runtime._loop_lag): a cheap, always-on probe.
LOOP_LAG = Histogram(
    "collab_event_loop_lag_seconds",
    "How late the event loop ran a timer due every 20 ms",
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
)
EARLY_REQUESTS = Counter(
    "collab_early_requests",
    "Model requests sent before their post was stored (chat/replies/early.py): taken by their reply, or wasted",
    ["outcome"],
)
FINALS_REPAIRED = Counter(
    "collab_finals_repaired", "Final frames sent again to sockets that never got them (collab/chat/repair.py)"
)
RENDERS = Counter(
    "collab_renders",
    "Markdown renders (chat/render_pool.py): rendered, or shown plain (deadline: past the budget; failed)",
    ["outcome"],
)
# Room sockets past admission control (collab/chat/admission.py), and those told 4429.
CONNECTS = Counter("collab_connects", "Room WebSocket connects admitted (past admission control)")
CONNECTS_REFUSED = Counter(
    "collab_connects_refused", "Room WebSocket connects closed 4429 with a retry hint, by reason", ["reason"]
)
