"""What the run measures besides the simulated users: the processes' CPU and memory
(psutil), Redis' CPU and command counts (``INFO``) and the servers' own counters
(``GET /metrics``)."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

import psutil

from collab.loadtest.stats import Collector

__all__ = [
    "REDIS",
    "Counters",
    "Sampler",
    "level_resources",
    "redis_calls",
    "redis_cpu_seconds",
    "scrape_metrics",
    "slope_kb",
]

REDIS = "redis"  # the sampler's name for the Redis server


class Sampler(threading.Thread):
    """CPU seconds and RSS of the watched processes and of Redis, twice a second.

    A watched process may belong to a group (the N server processes make the group
    ``server``): each sample also holds the group's sum, under the group's name, when
    every member of the group could be measured.
    """

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(name="loadtest-sampler", daemon=True)
        self.interval = interval
        self.roots: dict[str, int] = {}  # name -> pid (its children count with it)
        self.groups: dict[str, list[str]] = {}  # group -> its members' names
        self.redis_url = ""
        self.samples: list[tuple[float, dict[str, tuple[float, float]]]] = []
        self._stop_event = threading.Event()
        self._procs: dict[int, psutil.Process] = {}
        self._redis: Any = None

    def watch(self, name: str, pid: int, group: str = "") -> None:
        self.roots[name] = pid
        if group:
            self.groups.setdefault(group, []).append(name)

    def unwatch(self, name: str) -> None:
        self.roots.pop(name, None)
        for members in self.groups.values():
            if name in members:
                members.remove(name)

    def watch_redis(self, url: str) -> None:
        """Sample Redis' own CPU (``INFO cpu``) and RSS (``INFO memory``) under ``redis``."""
        self.redis_url = url

    def watching(self, name: str) -> bool:
        return name in self.roots or name in self.groups or (name == REDIS and bool(self.redis_url))

    def _proc(self, pid: int) -> psutil.Process:
        p = self._procs.get(pid)
        if p is None:
            p = self._procs[pid] = psutil.Process(pid)
        return p

    def sample(self) -> dict[str, tuple[float, float]]:
        out: dict[str, tuple[float, float]] = {}
        for name, pid in list(self.roots.items()):
            cpu = rss = 0.0
            try:
                root = self._proc(pid)
                for p in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        t = self._proc(p.pid).cpu_times()
                        cpu += t.user + t.system
                        rss += self._proc(p.pid).memory_info().rss
            except psutil.Error:
                continue
            out[name] = (cpu, rss / 2**20)
        for group, members in list(self.groups.items()):
            if members and all(m in out for m in members):
                out[group] = (sum(out[m][0] for m in members), sum(out[m][1] for m in members))
        if self.redis_url:
            redis_now = self._redis_sample()
            if redis_now is not None:
                out[REDIS] = redis_now
        return out

    def _redis_sample(self) -> tuple[float, float] | None:
        import redis

        try:
            if self._redis is None:
                self._redis = redis.Redis.from_url(self.redis_url, socket_timeout=2, socket_connect_timeout=2)
            cpu = _cpu_of(self._redis.info("cpu"))
            return cpu, float(self._redis.info("memory").get("used_memory_rss", 0)) / 2**20
        except Exception:
            return None

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.samples.append((time.time(), self.sample()))
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)
        if self._redis is not None:
            with contextlib.suppress(Exception):
                self._redis.close()

    def latest(self, name: str, seconds: float = 2.0) -> tuple[float | None, float | None]:
        """(CPU % over the last ``seconds``, RSS MB now) of one watched process tree or group."""
        samples = [s for s in self.samples if name in s[1]]
        if len(samples) < 2:
            return None, samples[-1][1][name][1] if samples else None
        last = samples[-1]
        first = next((s for s in samples if s[0] >= last[0] - seconds), samples[-2])
        if first is last:
            first = samples[-2]
        dt = last[0] - first[0]
        used = _used(name, [s[1][name][0] for s in samples if first[0] <= s[0] <= last[0]])
        cpu = used / dt * 100 if dt > 0 else None
        return cpu, last[1][name][1]

    def window(self, name: str, start: float, end: float) -> tuple[float | None, float | None]:
        """(CPU % over [start, end], peak RSS MB in it) of one watched process tree or group."""
        inside = [s for s in self.samples if name in s[1] and start - self.interval <= s[0] <= end + 0.01]
        if len(inside) < 2:
            return None, None
        first, last = inside[0], inside[-1]
        dt = last[0] - first[0]
        cpu = _used(name, [s[1][name][0] for s in inside]) / dt * 100 if dt > 0 else None
        rss = max(s[1][name][1] for s in inside)
        return (round(cpu, 1) if cpu is not None else None), round(rss, 1)


def increase(series: Sequence[float]) -> float:
    """How much a counter grew over its reads, in order. A counter that went down was
    reset (its Redis or server process restarted: the storm scenario does both), so its
    new value is what it grew since; Prometheus' increase() reads a reset the same way."""
    grown = 0.0
    for was, now in itertools.pairwise(series):
        grown += now - was if now >= was else now
    return grown


def _used(name: str, cpu_s: Sequence[float]) -> float:
    """CPU seconds used over one watched name's reads. Redis' counter is one process's,
    reset when it restarts; a process tree's is the sum over its live processes, which
    drops by a child's whole share when that child exits: no reset to read, only the ends."""
    return increase(cpu_s) if name == REDIS else cpu_s[-1] - cpu_s[0]


# --- Redis --------------------------------------------------------------------------------------


def _cpu_of(info: Mapping[str, Any]) -> float:
    return float(info.get("used_cpu_sys", 0.0)) + float(info.get("used_cpu_user", 0.0))


def _info(url: str, section: str) -> dict[str, Any] | None:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            return dict(client.info(section))
        finally:
            client.close()
    except Exception:
        return None


def redis_calls(url: str) -> dict[str, int] | None:
    """Calls so far per command (``INFO commandstats``; Redis 7 names subcommands ``a|b``)."""
    stats = _info(url, "commandstats")
    if stats is None:
        return None
    out: dict[str, int] = {}
    for key, value in stats.items():
        if key.startswith("cmdstat_") and isinstance(value, Mapping):
            out[key.removeprefix("cmdstat_")] = int(value.get("calls", 0))
    return out


def redis_cpu_seconds(url: str) -> float | None:
    """Redis' CPU so far: ``used_cpu_sys`` + ``used_cpu_user`` of ``INFO cpu``."""
    info = _info(url, "cpu")
    return _cpu_of(info) if info is not None else None


# --- the servers' own counters ---------------------------------------------------------------------


def scrape_metrics(base_url: str, token: str, timeout: float = 5.0) -> dict[str, float] | None:
    """A server's ``GET /metrics`` (Prometheus text) as {"name{labels}": value}, or None."""
    req = urllib.request.Request(base_url.rstrip("/") + "/metrics", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
    except (OSError, urllib.error.HTTPError):
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[key] = float(value)
    return out


# --- one load level's figures --------------------------------------------------------------------


@dataclasses.dataclass
class Counters:
    """What the servers and Redis had counted at one moment (before and after a level)."""

    at: float
    redis_calls: dict[str, int] | None
    redis_cpu_s: float | None
    metrics: list[dict[str, float] | None]  # each server process's /metrics

    @classmethod
    def read(cls, targets: Sequence[str], metrics_token: str, redis_url: str) -> Counters:
        return cls(
            at=time.time(),
            redis_calls=redis_calls(redis_url) if redis_url else None,
            redis_cpu_s=redis_cpu_seconds(redis_url) if redis_url else None,
            metrics=[scrape_metrics(t, metrics_token) if metrics_token else None for t in targets],
        )


def level_resources(
    sampler: Sampler,
    col: Collector,
    params: Mapping[str, Any],
    targets: Sequence[str],
    before: Counters,
    after: Counters,
) -> dict[str, Any]:
    """The processes' CPU and memory over the level's posting window, each server
    process's share, and Redis' commands per reply over the whole level."""
    out: dict[str, Any] = {}
    if len(col.window) == 2:
        start, end = col.window
        cpu, rss = sampler.window("server", start, end)
        out["server_cpu_percent"], out["server_rss_mb"] = cpu, rss
        out["generator_cpu_percent"], out["generator_rss_mb"] = sampler.window("generator", start, end)
        out["simulator_cpu_percent"], _ = sampler.window("simulator", start, end)
        if sampler.watching(REDIS):
            out["redis_cpu_percent"], _ = sampler.window(REDIS, start, end)
        baseline = params.get("_rss_baseline_mb")
        if baseline is not None and rss is not None and params.get("sockets"):
            out["server_rss_baseline_mb"] = baseline
            sockets = col.counts.get("sockets", 0) or params["sockets"]
            out["kb_per_connection"] = round((rss - baseline) * 1024 / sockets, 1)
    start, end = col.window if len(col.window) == 2 else (before.at, after.at)
    servers = []
    for i, target in enumerate(targets):
        cpu, rss = sampler.window(f"server/{i}", start, end)
        m0, m1 = before.metrics[i], after.metrics[i]
        servers.append(
            {
                "target": target,
                "cpu_percent": cpu,
                "rss_mb": rss,
                "sockets": col.counts.get(f"sockets_server_{i}", 0),  # the members' sockets it served
                "posts": _grown(m0, m1, "collab_posts_total"),  # the posts it took
                "replies": _grown(m0, m1, "collab_replies_total{"),  # the replies it ran
                "frames_sent": _grown(m0, m1, "collab_frames_total{"),  # room frames it broadcast
                "frames_received": _grown(m0, m1, "collab_room_frames_received_total"),  # for its sockets
            }
        )
    out["servers"] = servers
    out["receptions_per_frame"] = receptions_per_frame(servers)
    out.update(cpu_per_unit(sampler, col, before, after))
    out["server_loop_lag_ms"] = loop_lag(before.metrics, after.metrics)
    if before.redis_calls is not None and after.redis_calls is not None:
        was = before.redis_calls
        # INFO is left out: the run's own reads (this sampler, these counters).
        calls = {cmd: int(increase([was.get(cmd, 0), n])) for cmd, n in after.redis_calls.items() if cmd != "info"}
        calls = dict(sorted(((k, n) for k, n in calls.items() if n > 0), key=lambda kv: (-kv[1], kv[0])))
        out["redis_calls"] = calls
        replies = col.counts.get("replies_completed", 0)
        if replies:
            per = {cmd: round(n / replies, 2) for cmd, n in calls.items()}
            out["redis_ops_per_reply"] = {"total": round(sum(calls.values()) / replies, 2), **per}
    if before.redis_cpu_s is not None and after.redis_cpu_s is not None and after.at > before.at:
        used = increase([before.redis_cpu_s, after.redis_cpu_s])
        out["redis_cpu_level_percent"] = round(used / (after.at - before.at) * 100, 1)
    return out


def idle_cpu(sampler: Sampler, started: float, window: Sequence[float], sockets: int) -> dict[str, float | None]:
    """The idle scenario's two costs: the server's CPU per connect while the sockets
    open (from the generator's start to the held window: the connects and the heartbeats
    of those already open, which are a small part of it), the connects per second then,
    and its CPU at rest over the held window (heartbeats, presence renewals)."""
    if len(window) != 2 or not sockets or window[0] <= started:
        return {"cpu_ms_per_connect": None, "connects_per_s": None, "cpu_percent_at_rest": None}
    ramp = window[0] - started
    cpu, _ = sampler.window("server", started, window[0])
    rest, _ = sampler.window("server", window[0], window[1])
    per = round(cpu / 100 * ramp * 1000 / sockets, 2) if cpu is not None else None
    return {"cpu_ms_per_connect": per, "connects_per_s": round(sockets / ramp, 1), "cpu_percent_at_rest": rest}


def receptions_per_frame(servers: Sequence[Mapping[str, Any]]) -> float | None:
    """How many processes received each room frame, on average: the frames the processes
    received for their sockets over the frames broadcast (1.0 when each room lives on one
    process; k when its members are spread over k). None without the metrics."""
    sent = received = 0
    for server in servers:
        if server.get("frames_sent") is None or server.get("frames_received") is None:
            return None
        sent += int(server["frames_sent"])
        received += int(server["frames_received"])
    return round(received / sent, 2) if sent else None


def cpu_per_unit(sampler: Sampler, col: Collector, before: Counters, after: Counters) -> dict[str, float | None]:
    """The servers' CPU time per unit of work, in microseconds
    (docs/benchmarks/2026-12-04.md#b-cpu-per-token-window), both
    over the posting window: `server_cpu_us_per_delivery` per frame a member received in
    it, `server_cpu_us_per_token` per model token read in it (each reply's data-tokens, in
    the share of its stream inside the window). `server_cpu_us_per_token_level`: over the
    whole level, members connecting and the drain included, per token the servers read
    (from their /metrics; None without the metrics token), as earlier reports gave it."""
    out: dict[str, float | None] = {
        "server_cpu_us_per_delivery": None,
        "server_cpu_us_per_token": None,
        "server_cpu_us_per_token_level": None,
    }
    if len(col.window) == 2:
        start, end = col.window
        cpu, _ = sampler.window("server", start, end)
        if cpu is not None:
            used_s = cpu / 100 * (end - start)
            for key, unit in (("server_cpu_us_per_delivery", "deliveries"), ("server_cpu_us_per_token", "tokens")):
                if col.counts.get(unit, 0):
                    out[key] = round(used_s / col.counts[unit] * 1e6, 1)
    tokens = [_grown(m0, m1, "collab_reply_tokens_total") for m0, m1 in zip(before.metrics, after.metrics, strict=True)]
    if tokens and all(t is not None for t in tokens) and sum(t or 0 for t in tokens) > 0 and after.at > before.at:
        cpu, _ = sampler.window("server", before.at, after.at)
        if cpu is not None:
            used_s = cpu / 100 * (after.at - before.at)
            out["server_cpu_us_per_token_level"] = round(used_s / sum(t or 0 for t in tokens) * 1e6, 1)
    return out


LOOP_LAG = "collab_event_loop_lag_seconds_bucket{le="


def loop_lag(
    before: Sequence[Mapping[str, float] | None], after: Sequence[Mapping[str, float] | None]
) -> dict[str, float] | None:
    """How late the servers' event loops ran their 20 ms probe timer over the level
    (collab/chat/lifecycle.py), from the growth of each /metrics histogram, all servers
    together: {"p50", "p99", "max"} in ms, each the upper bound of the bucket it falls in
    (so "<= 5 ms"; "max" the highest bucket that grew). None without the metrics."""
    grown: dict[float, float] = {}
    for m0, m1 in zip(before, after, strict=True):
        if m0 is None or m1 is None:
            return None
        for key, value in m1.items():
            if key.startswith(LOOP_LAG):
                le = float(key[len(LOOP_LAG) :].split('"')[1])  # +Inf reads as inf
                grown[le] = grown.get(le, 0.0) + value - m0.get(key, 0.0)
    bounds = sorted(grown)
    total = grown[bounds[-1]] if bounds else 0.0  # the buckets are cumulative: +Inf holds all
    if total <= 0:
        return None
    out: dict[str, float] = {}
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        out[name] = next(le for le in bounds if grown[le] >= q * total) * 1000
    out["max"] = next(le for le in bounds if grown[le] >= total) * 1000
    return out


def _grown(m0: Mapping[str, float] | None, m1: Mapping[str, float] | None, prefix: str) -> int | None:
    """How much the counters named ``prefix...`` grew between two reads of /metrics."""
    if m0 is None or m1 is None:
        return None
    now = sum(v for k, v in m1.items() if k.startswith(prefix))
    return int(increase([sum(v for k, v in m0.items() if k.startswith(prefix)), now]))


def slope_kb(points: Sequence[tuple[int, float]]) -> float | None:
    """Least-squares KB of server RSS per open socket, from samples taken while they opened."""
    if len(points) < 5:
        return None
    top = max(n for n, _ in points)
    pts = [(float(n), rss) for n, rss in points if n >= 0.1 * top]
    if len(pts) < 5:
        return None
    mx = sum(n for n, _ in pts) / len(pts)
    my = sum(r for _, r in pts) / len(pts)
    var = sum((n - mx) ** 2 for n, _ in pts)
    if var == 0:
        return None
    return round(sum((n - mx) * (r - my) for n, r in pts) / var * 1024, 1)
