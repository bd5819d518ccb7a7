"""A whole load-test run: start what the scenario needs on loopback (collab.loadtest.stack),
seed, run Locust for each load level, measure the processes (collab.loadtest.sampler),
stop everything, report.

Locust runs as a subprocess (gevent's monkey patching stays out of this process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from collab.loadtest import machine
from collab.loadtest.config import RunConfig
from collab.loadtest.options import Options
from collab.loadtest.report import build_step, knee_of, passes, summary
from collab.loadtest.sampler import REDIS, Counters, Sampler, idle_cpu, level_resources, slope_kb
from collab.loadtest.scenarios import Scenario
from collab.loadtest.stack import BASE_DIR, IDLE_ROOMS, Processes, Stack, redis_answers, warm_up
from collab.loadtest.stats import Collector
from collab.loadtest.storm import Restart, mark_posters
from collab.loadtest.storm import check as check_storm

__all__ = ["Options", "run"]

LOCUSTFILE = Path(__file__).with_name("locustfile.py")

Say = Callable[[str], None]


# --- one load level through Locust ---------------------------------------------------------------


@dataclasses.dataclass
class Level:
    rooms: int
    members: int
    tabs: int = 1


@dataclasses.dataclass
class Servers:
    """The server processes under test, as the run reaches and measures them."""

    targets: list[str]  # each process's base URL; which a member uses: RunConfig.server_of
    model_url: str
    layer: str
    metrics_token: str = ""  # for each process's GET /metrics ("": not read)
    redis_url: str = ""  # the channel layer's Redis, for INFO ("": not measured)
    commands: dict[str, Any] = dataclasses.field(default_factory=dict)  # the stack's, for the storm


def _level_params(sc: Scenario, level: Level, opts: Options, servers: Servers) -> dict[str, Any]:
    sockets = level.rooms * level.members * level.tabs
    return {
        "rooms": level.rooms,
        "members_per_room": level.members,
        "members_total": level.rooms * level.members,
        "sockets": sockets,
        "tabs_per_member": level.tabs,
        "assistants_per_room": sc.assistants,
        "mentions_per_post": sc.mentions,
        "concurrent_replies": _number(level.rooms * max(sc.offered, 0.0)),
        "posts_per_s_per_room": round(sc.post_rate(), 4),
        "tps": sc.tps,
        "model_ttft_ms": sc.ttft_ms,
        "reply_tokens": sc.reply_tokens,
        **({"agent_script": sc.agent_script, "runs": sc.runs} if sc.agent_script else {}),
        **({"mcp": sc.mcp} if sc.mcp else {}),
        **({"file_share": sc.file_share} if sc.file_share else {}),
        "sim_tick_ms": sc.tick_ms,
        "coalesce_ms": sc.coalesce_ms,
        "layer": servers.layer,
        "processes": len(servers.targets),
        **({"route": sc.route} if len(servers.targets) > 1 else {}),
        "duration_s": sc.duration_s,
        "login": sc.login if not opts.target else "http",
        "generator_processes": max(1, sc.workers),
        "target": opts.target or "loopback (started by the command)",
        "database": "postgresql" if opts.database_url else ("remote" if opts.target else "sqlite"),
        "seed": opts.seed,
    }


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else round(value, 2)


class Progress:
    """The live progress line."""

    def __init__(self, interactive: bool, say: Say) -> None:
        self.interactive = interactive
        self.say = say
        self._last = 0.0
        self._width = 0

    def show(self, line: str) -> None:
        if self.interactive:
            pad = max(0, self._width - len(line))
            sys.stdout.write("\r" + line + " " * pad)
            sys.stdout.flush()
            self._width = len(line)
        elif time.monotonic() - self._last >= 5:
            self._last = time.monotonic()
            self.say(line)

    def end(self) -> None:
        if self.interactive and self._width:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self._width = 0


def run_level(
    opts: Options,
    label: str,
    rooms: list[dict[str, Any]],
    level: Level,
    params: dict[str, Any],
    procs: Processes,
    sampler: Sampler,
    servers: Servers,
    say: Say,
) -> dict[str, Any]:
    sc = opts.scenario
    workdir = procs.workdir
    tag = f"{sc.name}-{level.rooms}x{level.members}x{level.tabs}"
    out = workdir / f"{tag}.result.json"
    progress_path = workdir / f"{tag}.progress.json"
    for p in (out, progress_path):
        p.unlink(missing_ok=True)
    chosen = [dict(r, users=list(r["users"])[: level.members]) for r in rooms[: level.rooms]]
    mark_posters(chosen, sc.storm_share)
    cfg = RunConfig(
        target=servers.targets[0],
        targets=list(servers.targets),
        route=sc.route,
        rooms=chosen,
        post_rate=sc.post_rate(),
        mentions=sc.mentions,
        duration_s=sc.duration_s,
        drain_s=max(60.0 if sc.name == "storm" else 30.0, 5 * sc.reply_s()),
        runs=sc.runs,
        agent_script=sc.agent_script,
        file_share=sc.file_share,
        sockets_per_member=level.tabs,
        tps=sc.tps,
        ttft_ms=sc.ttft_ms,
        tick_ms=sc.tick_ms,
        model_url=servers.model_url,
        storm=sc.name == "storm",
        storm_share=sc.storm_share,
        seed=opts.seed,
        out=str(out),
        progress=str(progress_path),
    )
    cfg_path = workdir / f"{tag}.config.json"
    cfg.save(cfg_path)
    n_users = len(chosen)
    login_s = 0.0 if sc.login == "session" and not opts.target else 1.0 * level.members
    budget = sc.duration_s + cfg.drain_s + login_s + 60 + cfg.sockets * cfg.handshake_budget_s
    cmd = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "-u", str(n_users), "-r", str(n_users), "-t", f"{math.ceil(budget)}s",
        "--collab-config", str(cfg_path), "--only-summary", "--stop-timeout", "10",
        "--loglevel", "WARNING",
    ]  # fmt: skip
    if sc.workers > 0:
        cmd += ["--processes", str(sc.workers)]
    if opts.locust_csv:
        cmd += ["--csv", f"{opts.locust_csv}-{tag}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLLAB_LOADTEST")}
    env["PYTHONPATH"] = os.pathsep.join([str(BASE_DIR), *filter(None, [env.get("PYTHONPATH", "")])])
    name = f"locust-{tag}"
    before = Counters.read(servers.targets, servers.metrics_token, servers.redis_url)
    started = time.time()  # (the sampler's clock) the sockets open from here to the window's start
    proc = procs.start(name, cmd, env)
    sampler.watch("generator", proc.pid)
    show = Progress(opts.interactive, say)
    deadline = time.monotonic() + budget + 30
    growth: list[tuple[int, float]] = []  # (sockets open, server RSS MB) while they open
    restart = Restart(opts.storm, procs, sampler, servers.commands, servers.targets[0]) if sc.name == "storm" else None
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                say("the load generator overran its time: stopping it")
                break
            if restart is not None and restart.due(progress_path, opts.storm_after_s):
                say(f"storm: restarting the {opts.storm}")
                restart.start()
            line, sockets = _progress_line(label, progress_path, sampler)
            show.show(line)
            rss = sampler.latest("server")[1]
            if sockets and rss is not None:
                growth.append((sockets, rss))
            time.sleep(0.5)  # the progress display's refresh
    finally:
        show.end()
        procs.stop(name)
        sampler.unwatch("generator")
    after = Counters.read(servers.targets, servers.metrics_token, servers.redis_url)
    if not out.exists():
        raise RuntimeError(f"the load generator wrote no result:\n{procs.log_tail(name)}")
    result = json.loads(out.read_text())
    col = Collector.from_json(result["collector"])
    resources = level_resources(sampler, col, params, servers.targets, before, after)
    if sc.idle:
        resources["kb_per_connection_slope"] = slope_kb(growth)
        resources.update(idle_cpu(sampler, started, col.window, col.counts.get("sockets", 0)))
    clean = {k: v for k, v in params.items() if not k.startswith("_")}
    step = build_step(sc.name, clean, col, resources, sc.ttft_ms, complete=bool(result.get("complete")))
    if restart is not None:
        step["storm"] = restart.report(col, progress_path, params["sockets"], say)
    return step


def _progress_line(label: str, path: Path, sampler: Sampler) -> tuple[str, int]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    live = data.get("live", {})
    phase = data.get("phase", "starting")
    cpu, rss = sampler.latest("server")
    gen, _ = sampler.latest("generator")
    parts = [
        f"[{label}] {phase} {data.get('elapsed_s', 0):.0f}s",
        f"sockets {live.get('sockets', 0)}",
        f"posts {live.get('posts', 0)}",
        f"replies {live.get('completed', 0)} done/{live.get('failed', 0)} failed/"
        + f"{live.get('in_flight', 0)} in flight",
        f"server {cpu or 0:.0f}% CPU {rss or 0:.0f} MB",
        f"generator {gen or 0:.0f}% CPU",
    ]
    if sampler.watching(REDIS):
        parts.append(f"redis {sampler.latest(REDIS)[0] or 0:.0f}% CPU")
    return " | ".join(parts), int(live.get("sockets", 0))


# --- the whole run ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # SIGINT too: a shell starts background jobs with it ignored, and Ctrl-C must still clean up.
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _levels(sc: Scenario, rooms_available: int) -> list[Level]:
    if sc.idle:
        per_tab = IDLE_ROOMS * sc.members
        return [Level(IDLE_ROOMS, sc.members, max(1, math.ceil(n / per_tab))) for n in sc.levels]
    return [Level(min(n, rooms_available), sc.members) for n in sc.levels if n <= rooms_available]


def run(opts: Options, say: Say) -> dict[str, Any]:
    """Run the scenario; return its report (docs/wire.md)."""
    sc = opts.scenario
    keep = bool(opts.workdir)
    workdir = Path(opts.workdir) if keep else Path(tempfile.mkdtemp(prefix="collab-loadtest-"))
    workdir.mkdir(parents=True, exist_ok=True)
    here = machine.state()  # before any process of the run starts
    say(machine.line(here))
    procs = Processes(workdir)
    sampler = Sampler()
    sampler.start()
    steps: list[dict[str, Any]] = []
    try:
        with _sigterm_as_interrupt():
            if opts.target and sc.name == "storm":
                raise RuntimeError("storm restarts the server it started: not with --target")
            if opts.target:
                credentials = json.loads(Path(opts.credentials).read_text())
                servers = Servers([opts.target.rstrip("/")], opts.model_url, "remote")
                if opts.server_pid:
                    sampler.watch("server/0", opts.server_pid, group="server")
                servers.redis_url = _remote_redis(opts)
                if servers.redis_url:
                    sampler.watch_redis(servers.redis_url)
            else:
                say(f"starting the simulated model, the database and Daphne in {workdir}")
                stack = Stack(opts, procs, sampler, say)
                stack.start()
                credentials = stack.credentials
                servers = Servers(
                    stack.targets, stack.model_url, sc.layer, stack.metrics_token, stack.redis_url, stack.commands
                )
                if sc.name == "storm":
                    check_storm(opts, stack.commands, len(stack.targets))
                where = " ".join(stack.targets)
                if len(stack.targets) > 1:
                    how = "each room on one, by hash" if sc.route == "hash" else "each room's members spread over them"
                    where = f"{len(stack.targets)} processes {where} ({how})"
                say(f"server {where} (layer {sc.layer}, coalescing {sc.coalesce_ms:g} ms), model {stack.model_url}")
                if len(stack.targets) > 1 and not opts.database_url:
                    say("the server processes share one SQLite file (WAL): fine for a load test on one machine;")
                    say("  --database-url postgres://... puts them on PostgreSQL")
            rooms = credentials["rooms"]
            if opts.warmup:
                for target in servers.targets:
                    warm_up(target, rooms[0], post=not sc.idle)
            baseline = _rss_now(sampler) if sc.idle else None
            levels = _levels(sc, len(rooms))
            if not levels:
                raise RuntimeError(f"the credentials hold {len(rooms)} rooms: too few for {sc.levels}")
            for i, level in enumerate(levels, 1):
                if i > 1:
                    _settle(sampler, say)
                params = _level_params(sc, level, opts, servers)
                if baseline is not None:
                    # The server's size before any idle socket: freed memory is reused by the
                    # next level rather than given back, so every level is measured from here.
                    params["_rss_baseline_mb"] = baseline
                label = f"{sc.name} {i}/{len(levels)}: {level.rooms} rooms x {level.members}"
                if level.tabs > 1:
                    label += f" x {level.tabs} tabs"
                step = run_level(opts, label, rooms, level, params, procs, sampler, servers, say)
                steps.append(step)
                say(summary(step))
                if sc.sweep and sc.stop_at_knee and not _step_ok(sc, step):
                    say("past the knee: the sweep stops here")
                    break
    finally:
        sampler.stop()
        procs.stop_all()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    report = _assemble(sc, steps)
    report["machine"] = here
    return report


def _remote_redis(opts: Options) -> str:
    """With --target: the Redis named by --redis (env or a URL), if it answers, to read INFO."""
    if opts.redis == "start":
        return ""
    url = (os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0") if opts.redis == "env" else opts.redis
    return url if redis_answers(url) else ""


def _settle(sampler: Sampler, say: Say, quiet_percent: float = 15.0, timeout: float = 60.0) -> None:
    """Before the next level, let the server finish what the last one left it (bounded)."""
    if not sampler.watching("server"):
        return
    deadline = time.monotonic() + timeout
    time.sleep(1.5)  # at least three samples of the server's CPU
    while time.monotonic() < deadline:
        cpu, _ = sampler.latest("server", seconds=1.0)
        if cpu is not None and cpu < quiet_percent:
            return
        time.sleep(0.5)  # polling the sampler
    say(f"the server is still busy after {timeout:g} s: the next level starts anyway")


def _rss_now(sampler: Sampler) -> float | None:
    sample = sampler.sample().get("server")
    return round(sample[1], 1) if sample else None


def _step_ok(sc: Scenario, step: Mapping[str, Any]) -> bool:
    if sc.idle:
        d = step["details"]
        return d["sockets"] >= step["params"]["sockets"] and d["sockets_open_at_end"] >= d["sockets"]
    return passes(step)


def _assemble(sc: Scenario, steps: list[dict[str, Any]]) -> dict[str, Any]:
    if not steps:
        raise RuntimeError("no load level ran")
    if not sc.sweep:
        return steps[0]
    if sc.idle:
        good = [s for s in steps if _step_ok(sc, s)]
        top = dict((good or steps)[-1])
        top["idle"] = {
            "max_sockets": good[-1]["params"]["sockets"] if good else 0,
            "kb_per_connection": top["details"].get("kb_per_connection"),
            "kb_per_connection_slope": top["details"].get("kb_per_connection_slope"),
            "server_rss_baseline_mb": top["details"].get("server_rss_baseline_mb"),
            "cpu_ms_per_connect": top["details"].get("cpu_ms_per_connect"),
            "connects_per_s": top["details"].get("connects_per_s"),
            "cpu_percent_at_rest": top["details"].get("cpu_percent_at_rest"),
        }
    else:
        knee = knee_of(steps)
        level = knee["concurrent_replies"] if knee else None
        at_knee = [s for s in steps if s["params"]["concurrent_replies"] == level]
        top = dict(at_knee[0] if at_knee else steps[0])
        top["knee"] = knee
    if sc.idle:
        top["params"] = dict(top["params"], top_level="the largest level that held")
    else:
        which = "the knee's level" if top["knee"] else "the first level"
        top["params"] = dict(top["params"], top_level=which)
    top["steps"] = steps
    return top
