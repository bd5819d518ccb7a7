"""The load-test scenarios (issue 4) and the parameters that shape them."""

from __future__ import annotations

import dataclasses
from typing import Literal

__all__ = ["SCENARIOS", "Scenario"]

Layer = Literal["memory", "pubsub", "core"]


@dataclasses.dataclass
class Scenario:
    name: str
    summary: str
    levels: list[int]  # rooms per load level; more than one makes a sweep
    members: int = 10  # per room
    assistants: int = 1  # per room
    mentions: int = 1  # assistants @mentioned per post
    # Replies in flight per room, on average, that the Poisson posting rate offers:
    # rate = offered / (mentions x (ttft + reply_tokens / tps)).
    offered: float = 1.0
    tps: float = 750.0
    ttft_ms: float = 100.0
    reply_tokens: int = 750
    tick_ms: float = 0.0  # simulator write tick: 0 writes every token at its due time
    duration_s: float = 20.0  # posting (or, idle, holding) time per level
    coalesce_ms: float = 30.0  # COLLAB_COALESCE_MS; 0 = a frame per token
    layer: Layer = "memory"
    login: Literal["http", "session"] = "http"
    sockets: int = 0  # idle: WebSockets per level are levels[i] (rooms x members x tabs)
    workers: int = 0  # Locust worker processes (0: one process, the local runner)
    processes: int = 1  # Daphne server processes
    # With several: "hash", a room's members all connect to the process its socket's path
    # hashes to (as deploy/nginx.conf routes them); "spread", member i to process i mod N.
    route: str = "hash"
    stop_at_knee: bool = True  # a sweep stops after the first level past the knee
    # Agents (issue 13): the seeded assistants are agents and every post is this script of
    # tool calls for the simulated model (collab/simulator/README.md, "Tool calls (agents)").
    agent_script: str = ""
    # `--mcp http|stdio` (issue 37): the agents' tools are an MCP server's, started by the run
    # (collab/loadtest/mcp_server.py), over Streamable HTTP or as a stdio child per call.
    mcp: str = ""
    # `files` (issue 36): this share of the posts uploads a file first, a ~200 KB image and a
    # ~1 MB PDF in turn (collab/loadtest/files.py).
    file_share: float = 0.0
    storm_share: float = 0.0  # storm: the share of rooms that post one long reply before the restart
    runs: int = 0  # > 0: that many posts per room, one after another, instead of Poisson arrivals

    @property
    def sweep(self) -> bool:
        return len(self.levels) > 1 or self.name in ("many-rooms", "naive", "idle")

    @property
    def idle(self) -> bool:
        return self.offered <= 0 and self.name != "storm"

    def reply_s(self) -> float:
        if self.agent_script:  # a plan (<= 300 tokens), per round a step and a check, the answer
            rounds = self.agent_script.count("{{next}}") + 1
            tokens = min(300, self.reply_tokens) + 20 * rounds + self.reply_tokens
            return (2 + 2 * rounds) * self.ttft_ms / 1000.0 + tokens / self.tps
        return self.ttft_ms / 1000.0 + self.reply_tokens / self.tps

    def post_rate(self) -> float:
        """Posts per second per room (Poisson)."""
        if self.idle or self.mentions <= 0:
            return 0.0
        return self.offered / (self.mentions * self.reply_s())


# The agents scenario's script with `--mcp`: the same two rounds, each an MCP tool's call.
MCP_AGENT_SCRIPT = '{{tool loadmcp__add {"a": 6, "b": 36}}}{{next}}{{tool loadmcp__echo {"text": "on time"}}}'

# Many-rooms and naive share everything but the two settings the comparison is about.
_SWEEP_LEVELS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 64]

SCENARIOS: dict[str, Scenario] = {
    "one-room": Scenario(
        "one-room",
        "10 members, one reply at a time at 750 tokens/s (Poisson posts, ~0.5 replies in flight)",
        levels=[1],
        offered=0.5,
        duration_s=30.0,
    ),
    "parallel": Scenario(
        "parallel",
        "one room of 10, every post @mentions 4 assistants answering at once at 750 tokens/s",
        levels=[1],
        assistants=4,
        mentions=4,
        offered=2.0,
        duration_s=30.0,
    ),
    "many-rooms": Scenario(
        "many-rooms",
        "rooms x 10 members, ~1 reply in flight per room at 750 tokens/s, swept up to the knee",
        levels=list(_SWEEP_LEVELS),
        offered=1.0,
        tick_ms=5.0,
        duration_s=15.0,
        layer="pubsub",
        login="session",
    ),
    "naive": Scenario(
        "naive",
        "many-rooms with no coalescing (a frame per token) and channels_redis' default layer",
        levels=list(_SWEEP_LEVELS),
        offered=1.0,
        tick_ms=5.0,
        duration_s=15.0,
        coalesce_ms=0.0,
        layer="core",
        login="session",
    ),
    "agents": Scenario(
        "agents",
        "one room of 10, every post @mentions an agent scripted to call tools in 2 rounds, at 750 tokens/s",
        levels=[1],
        offered=1.0,
        duration_s=30.0,
        agent_script='{{tool calculate {"expression": "6*7"}}}{{next}}{{tool current_time {}}}',
    ),
    "files": Scenario(
        "files",
        "one room of 10 as one-room, half the posts carrying a ~200 KB image or a ~1 MB PDF (uploaded first)",
        levels=[1],
        offered=0.5,
        duration_s=30.0,
        file_share=0.5,
    ),
    "storm": Scenario(
        "storm",
        "members idle in rooms, a few long replies streaming, then the server (or Redis) restarts:"
        " every page reconnects with its back-off",
        levels=[500],
        members=10,
        offered=0.0,
        storm_share=0.1,
        tps=100.0,
        reply_tokens=3000,  # ~10 s (the app caps a reply near 1,000 tokens): streaming at the restart
        duration_s=3.0,
        layer="pubsub",
        login="session",
    ),
    "idle": Scenario(
        "idle",
        "idle WebSockets (members with several tabs), as many as the machine allows: memory each",
        levels=[8000],
        members=10,
        offered=0.0,
        duration_s=5.0,
        layer="pubsub",
        login="session",
        stop_at_knee=True,
    ),
}
