"""The machine's state as a load test starts: how fast it runs a fixed piece of Python
now, how busy it is, how many CPUs it has.

This project's machine runs the same code at speeds a factor of two apart within
minutes, idle, and the server's CPU per delivery and per token follow that speed
(docs/benchmarks/2026-12-05.md#b-window-read). A figure is only comparable with
another taken at a similar probe, so every report carries the probe it was taken at.
With --target it is the load generator's machine, which may not be the server's.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

__all__ = ["line", "speed_probe_ms", "state"]

RUNS = 5
ITERATIONS = 200_000


def speed_probe_ms(runs: int = RUNS, iterations: int = ITERATIONS) -> float:
    """The best of `runs` timings of a fixed loop of plain Python (small lists made into
    JSON and kept in a dict), in ms: lower is faster."""
    best = math.inf
    for _ in range(runs):
        kept: dict[int, str] = {}
        start = time.perf_counter()
        for i in range(iterations):
            kept[i % 1000] = json.dumps([i, "x" * (i % 7)])
        best = min(best, time.perf_counter() - start)
    return round(best * 1000, 1)


def state() -> dict[str, Any]:
    """The report's `machine` (docs/wire.md, "Load test report")."""
    return {
        "speed_probe_ms": speed_probe_ms(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }


def line(machine: dict[str, Any]) -> str:
    load = " ".join(f"{x:.2f}" for x in machine["load_average"])
    return (
        f"machine: speed probe {machine['speed_probe_ms']:g} ms (best of {RUNS} runs of a fixed piece of"
        f" Python; lower is faster), load average {load}, {machine['cpus']} CPUs"
    )
