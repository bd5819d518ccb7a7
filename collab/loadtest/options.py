"""What a ``loadtest`` run was asked for, besides the scenario's own parameters."""

from __future__ import annotations

import dataclasses

from collab.loadtest.scenarios import Scenario

__all__ = ["Options"]


@dataclasses.dataclass
class Options:
    scenario: Scenario
    target: str = ""  # remote mode: the server's base URL
    credentials: str = ""  # remote mode: seed_loadtest's JSON
    model_url: str = ""  # remote mode: the model, for direct TTFT probes
    server_pid: int = 0  # remote mode on this machine: measure that process
    redis: str = "start"  # "start" (a private redis-server), "env" ($REDIS_URL or :6379) or a redis:// URL
    database_url: str = ""
    workdir: str = ""  # keep logs and files here (default: a temporary folder, removed)
    warmup: bool = True
    locust_csv: str = ""
    seed: int = 0
    interactive: bool = False  # redraw one progress line (a terminal) or print one now and then
    storm: str = "server"  # storm: restart the server process or Redis ("redis")
    storm_after_s: float = 2.0  # storm: the restart, this long after posting began
    storm_drain_s: float = 2.0  # storm: the old server's COLLAB_DRAIN_S
    asgi_app: str = "collab.asgi:application"  # what Daphne serves (a wrapper, to profile)
