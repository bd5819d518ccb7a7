"""What one load-generator run needs to know, as a JSON file.

The ``loadtest`` command writes it and points Locust at it (``--collab-config FILE`` or
the ``COLLAB_LOADTEST_CONFIG`` variable); someone running ``locust -f
collab/loadtest/locustfile.py`` by hand writes it themselves (see docs/loadtest.md). It
holds only what a user of the site would have: the server's address, the accounts
``seed_loadtest`` wrote, and what the simulated model is known to do.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

from collab.loadtest.route import Ring, room_path

__all__ = ["RunConfig", "ws_base"]


@dataclasses.dataclass
class RunConfig:
    target: str  # http://127.0.0.1:PORT
    rooms: list[dict[str, Any]]  # seed_loadtest's "rooms" (users may carry a "session")
    # Several server processes of one app (empty: every member uses ``target``); `route`
    # says which one a room's member connects to (collab/loadtest/route.py): "spread",
    # member i of every room uses targets[i % N]; "hash", every member of a room uses the
    # process its socket's path hashes to.
    targets: list[str] = dataclasses.field(default_factory=list)
    route: str = "spread"
    post_rate: float = 0.5  # posts per second per room, Poisson; 0: idle sockets only
    mentions: int = 1  # assistants @mentioned per post (the first N of the room's)
    duration_s: float = 10.0  # posting phase
    drain_s: float = 30.0  # after it, how long replies in flight may take to end
    runs: int = 0  # > 0: that many posts per room, each once the last reply ended (not Poisson)
    file_share: float = 0.0  # files: the share of posts that upload a file first (collab/loadtest/files.py)
    agent_script: str = ""  # agents: each post is @mentions + this tool script (collab/loadtest/agents.py)
    # storm (issue 38): this share of the rooms posts one long reply at the start; sockets
    # reconnect for as long as the run lasts, keeping what they had of each reply.
    storm: bool = False
    storm_share: float = 0.0
    sockets_per_member: int = 1  # > 1 opens several tabs per member (the idle scenario)
    tps: float = 750.0  # the model's tokens/s (its schedule gives each token's emission time)
    ttft_ms: float = 100.0  # the model's configured first-token delay (used without probes)
    tick_ms: float = 0.0  # the simulator's write tick (0: every token at its due time)
    model_url: str = ""  # the model's base URL (…/v1) for direct TTFT probes; "" = none
    model_name: str = "sim"
    probe_interval_s: float = 0.25
    seed: int = 0
    out: str = ""  # where the master writes the merged result (JSON)
    progress: str = ""  # where the master writes live progress (JSON), every half second
    connect_timeout_s: float = 30.0
    connect_concurrency: int = 16  # WebSocket handshakes in progress at once, per process
    handshake_budget_s: float = 0.03  # connect wait per socket of the whole run (handshakes queue)

    @property
    def sockets(self) -> int:
        return sum(len(r["users"]) for r in self.rooms) * max(1, self.sockets_per_member)

    go_timeout_s: float = 600.0  # longest wait for every room to be ready before posting
    origin: str = ""  # Origin header; default: the target

    @property
    def ws_base(self) -> str:
        return ws_base(self.target)

    @property
    def origin_header(self) -> str:
        return self.origin or self.target.rstrip("/")

    def server_of(self, member: int, slug: str = "") -> int:
        """Which server process the room's ``member``-th member (from 0) connects to; with
        route "hash" and the room's ``slug``, the room's process whoever the member is."""
        if not self.targets:
            return 0
        if self.route == "hash" and slug:
            return self._ring.server_of(room_path(slug))
        return member % len(self.targets)

    @functools.cached_property
    def _ring(self) -> Ring:
        return Ring(self.targets)

    def target_of(self, server: int) -> str:
        return (self.targets[server] if self.targets else self.target).rstrip("/")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        data = json.loads(Path(path).read_text())
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def ws_base(target: str) -> str:
    """``ws://host:port`` of a server's ``http://host:port``."""
    return "ws://" + target.split("://", 1)[1].rstrip("/")
