"""A whole load-test run: start what the scenario needs on loopback, seed, run Locust,
measure the processes, stop everything, report.

Every process is started in its own session (process group) and stopped by that
group's id on the way out, whatever the way out is (end, error, Ctrl-C, SIGTERM).
Locust runs as a subprocess (gevent's monkey patching stays out of this process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import psutil

from collab.loadtest.client import http_login
from collab.loadtest.config import RunConfig
from collab.loadtest.report import build_step, knee_of, passes
from collab.loadtest.scenarios import Scenario
from collab.loadtest.stats import Collector
from collab.loadtest.wsclient import WebSocket

__all__ = ["Options", "run"]

BASE_DIR = Path(__file__).resolve().parents[2]
LOCUSTFILE = Path(__file__).with_name("locustfile.py")
PASSWORD = "load-" + "pw-1234"  # seeded accounts on a throwaway database
IDLE_ROOMS = 20  # the idle scenario spreads its sockets over this many rooms of `members`
_STOP_TIMEOUT_S = 10.0
_START_TIMEOUT_S = 90.0

Say = Callable[[str], None]


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
    asgi_app: str = "collab.asgi:application"  # what Daphne serves (a wrapper, to profile)


# --- processes --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Processes:
    """The processes this run started, each in its own process group; stops them all."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []

    def start(self, name: str, cmd: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop_all
        self._logs.append(log)
        proc = subprocess.Popen(
            list(cmd),
            cwd=BASE_DIR,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(_STOP_TIMEOUT_S)

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop(name)
        for log in self._logs:
            log.close()
        self._logs.clear()


def _wait_http(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = _START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer {url} within {timeout:g} s")
        time.sleep(0.1)  # polling a server that is starting


def _redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except Exception:
        return False


# --- resources --------------------------------------------------------------------------------


class Sampler(threading.Thread):
    """CPU seconds and RSS of the server, the simulator and the load generator, twice a second."""

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(name="loadtest-sampler", daemon=True)
        self.interval = interval
        self.roots: dict[str, int] = {}  # name -> pid (its children count with it)
        self.samples: list[tuple[float, dict[str, tuple[float, float]]]] = []
        self._stop_event = threading.Event()
        self._procs: dict[int, psutil.Process] = {}

    def watch(self, name: str, pid: int) -> None:
        self.roots[name] = pid

    def unwatch(self, name: str) -> None:
        self.roots.pop(name, None)

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
        return out

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.samples.append((time.time(), self.sample()))
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)

    def latest(self, name: str, seconds: float = 2.0) -> tuple[float | None, float | None]:
        """(CPU % over the last ``seconds``, RSS MB now) of one watched process tree."""
        samples = [s for s in self.samples if name in s[1]]
        if len(samples) < 2:
            return None, samples[-1][1][name][1] if samples else None
        last = samples[-1]
        first = next((s for s in samples if s[0] >= last[0] - seconds), samples[-2])
        if first is last:
            first = samples[-2]
        dt = last[0] - first[0]
        cpu = (last[1][name][0] - first[1][name][0]) / dt * 100 if dt > 0 else None
        return cpu, last[1][name][1]

    def window(self, name: str, start: float, end: float) -> tuple[float | None, float | None]:
        """(CPU % over [start, end], peak RSS MB in it) of one watched process tree."""
        inside = [s for s in self.samples if name in s[1] and start - self.interval <= s[0] <= end + 0.01]
        if len(inside) < 2:
            return None, None
        first, last = inside[0], inside[-1]
        dt = last[0] - first[0]
        cpu = (last[1][name][0] - first[1][name][0]) / dt * 100 if dt > 0 else None
        rss = max(s[1][name][1] for s in inside)
        return (round(cpu, 1) if cpu is not None else None), round(rss, 1)


# --- the servers on loopback -------------------------------------------------------------------


class Stack:
    """Redis (if the layer needs it), the simulated model, a seeded database and Daphne."""

    def __init__(self, opts: Options, procs: Processes, sampler: Sampler, say: Say) -> None:
        self.opts = opts
        self.sc = opts.scenario
        self.procs = procs
        self.sampler = sampler
        self.say = say
        self.workdir = procs.workdir
        self.env: dict[str, str] = {}
        self.target = ""
        self.model_url = ""
        self.redis_url = ""
        self.daphne_pid = 0
        self.credentials: dict[str, Any] = {}

    def _base_env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("COLLAB_", "DJANGO_")) and k not in ("DATABASE_URL", "REDIS_URL")
        }
        env["PYTHONPATH"] = os.pathsep.join([str(BASE_DIR), *filter(None, [env.get("PYTHONPATH", "")])])
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def start(self) -> None:
        sc = self.sc
        env = self._base_env()
        py = sys.executable
        # The channel layer.
        if sc.layer != "memory":
            self.redis_url = self._start_redis(env)
            env["REDIS_URL"] = self.redis_url
            env["COLLAB_REDIS_LAYER"] = "core" if sc.layer == "core" else "pubsub"
        # The simulated model.
        sim = self.procs.start(
            "simulator",
            [
                py, "-m", "collab.simulator", "--host", "127.0.0.1", "--port", "0",
                "--tps", f"{sc.tps:g}", "--ttft-ms", f"{sc.ttft_ms:g}", "--tick-ms", f"{sc.tick_ms:g}",
                "--reply-tokens", str(sc.reply_tokens), "--seed", str(self.opts.seed),
            ],
            env,
        )  # fmt: skip
        self.model_url = self._announced_url(sim)
        self.sampler.watch("simulator", sim.pid)
        # The app's settings.
        env.update(
            {
                # `manage.py loadtest --settings M` runs the server with those settings too.
                "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "collab.settings"),
                "DJANGO_SECRET_KEY": secrets.token_urlsafe(32),
                "COLLAB_LLM_BASE_URL": self.model_url,
                "COLLAB_LLM_MODEL": "sim",
                "COLLAB_COALESCE_MS": f"{sc.coalesce_ms:g}",
                # The load test posts faster than a person: lift the per-member rate limit.
                "COLLAB_POST_BURST": "100000",
                "COLLAB_POST_REFILL_S": "0.001",
                "COLLAB_LOG_LEVEL": "WARNING",
                "ALLOWED_HOSTS": "127.0.0.1,localhost",
                "COLLAB_STATIC_ROOT": str(self.workdir / "static"),
            }
        )
        if self.opts.database_url:
            env["DATABASE_URL"] = self.opts.database_url
        else:
            env["COLLAB_SQLITE_PATH"] = str(self.workdir / "db.sqlite3")
        self.env = env
        self._manage("migrate", "--noinput")
        rooms, members = self._accounts()
        seed = self.workdir / "seed.json"
        self._manage(
            "seed_loadtest", "--rooms", str(rooms), "--users-per-room", str(members),
            "--assistants", str(sc.assistants), "--output", str(seed), "--password", PASSWORD,
            "--prefix", "load",
        )  # fmt: skip
        if sc.login == "session":
            with_sessions = self.workdir / "seed-sessions.json"
            self._manage("loadtest_sessions", "--credentials", str(seed), "--output", str(with_sessions))
            seed = with_sessions
        self.credentials = json.loads(seed.read_text())
        port = free_port()
        daphne = self.procs.start(
            "daphne", [py, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), self.opts.asgi_app], env
        )
        self.target = f"http://127.0.0.1:{port}"
        _wait_http(self.target + "/healthz", daphne, "daphne")
        self.daphne_pid = daphne.pid
        self.sampler.watch("server", daphne.pid)

    def _accounts(self) -> tuple[int, int]:
        sc = self.sc
        if sc.idle:
            return IDLE_ROOMS, sc.members
        return max(sc.levels), sc.members

    def _manage(self, *args: str) -> None:
        name = args[0]
        proc = subprocess.run(
            [sys.executable, str(BASE_DIR / "manage.py"), *args],
            cwd=BASE_DIR,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        (self.workdir / f"{name}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"manage.py {name} failed:\n{(proc.stdout + proc.stderr)[-2000:]}")

    def _announced_url(self, proc: subprocess.Popen[bytes]) -> str:
        deadline = time.monotonic() + _START_TIMEOUT_S
        log = self.workdir / "simulator.log"
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace") if log.exists() else ""
            m = re.search(r"simulated model on (http://\S+/v1)", text)
            if m:
                _wait_http(m.group(1) + "/models", proc, "the simulator")
                return m.group(1)
            if proc.poll() is not None:
                raise RuntimeError(f"the simulator exited:\n{text[-2000:]}")
            time.sleep(0.05)  # polling a starting process's log
        raise RuntimeError("the simulator did not start")

    def _start_redis(self, env: Mapping[str, str]) -> str:
        if self.opts.redis == "env":
            url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
            if not _redis_answers(url):
                raise RuntimeError(f"no Redis answers at {url}")
            return url
        if self.opts.redis != "start":
            if not _redis_answers(self.opts.redis):
                raise RuntimeError(f"no Redis answers at {self.opts.redis}")
            return self.opts.redis
        binary = shutil.which("redis-server")
        if binary is None:
            fallback = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
            if _redis_answers(fallback):
                self.say(f"no redis-server to start: using {fallback} (share it with nothing else)")
                return fallback
            raise RuntimeError("the scenario needs Redis: install redis-server or pass --redis URL")
        port = free_port()
        proc = self.procs.start(
            "redis",
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            env,
        )
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 20
        while not _redis_answers(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start:\n{self.procs.log_tail('redis')}")
            time.sleep(0.05)  # polling a starting server
        self.sampler.watch("redis", proc.pid)
        return url


def warm_up(target: str, room: Mapping[str, Any], post: bool = True, timeout: float = 60.0) -> None:
    """One member logs in, connects and (``post``) asks once: no level pays for first use."""
    user = room["users"][0]
    session = user.get("session") or http_login(target, user["username"], user["password"])
    ws_url = "ws://" + target.split("://", 1)[1].rstrip("/") + f"/ws/rooms/{room['slug']}/"
    ws = WebSocket.connect(ws_url, {"Cookie": f"sessionid={session}", "Origin": target.rstrip("/")})
    ws.sock.settimeout(timeout)
    try:
        ws.recv_messages()  # the snapshot
        if not post or not room.get("assistants"):
            return
        text = " ".join("@" + a for a in room["assistants"]) + " warm-up: say something"
        ws.send_text(json.dumps({"text": text, "client_id": str(uuid.uuid4())}))
        finals = 0
        deadline = time.monotonic() + timeout
        while finals < len(room["assistants"]) and time.monotonic() < deadline:
            for frame in ws.recv_messages():
                if frame.startswith(b"<article ") and b'hx-swap-oob="true"' in frame[:600]:
                    finals += 1
    finally:
        ws.close()


# --- one load level through Locust ---------------------------------------------------------------


@dataclasses.dataclass
class Level:
    rooms: int
    members: int
    tabs: int = 1


def _level_params(sc: Scenario, level: Level, opts: Options, layer: str) -> dict[str, Any]:
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
        "sim_tick_ms": sc.tick_ms,
        "coalesce_ms": sc.coalesce_ms,
        "layer": layer,
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
    model_url: str,
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
    cfg = RunConfig(
        target=opts.target or params["_target"],
        rooms=chosen,
        post_rate=sc.post_rate(),
        mentions=sc.mentions,
        duration_s=sc.duration_s,
        drain_s=max(30.0, 5 * sc.reply_s()),
        sockets_per_member=level.tabs,
        tps=sc.tps,
        ttft_ms=sc.ttft_ms,
        tick_ms=sc.tick_ms,
        model_url=model_url,
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
    proc = procs.start(name, cmd, env)
    sampler.watch("generator", proc.pid)
    show = Progress(opts.interactive, say)
    deadline = time.monotonic() + budget + 30
    growth: list[tuple[int, float]] = []  # (sockets open, server RSS MB) while they open
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                say("the load generator overran its time: stopping it")
                break
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
    if not out.exists():
        raise RuntimeError(f"the load generator wrote no result:\n{procs.log_tail(name)}")
    result = json.loads(out.read_text())
    col = Collector.from_json(result["collector"])
    resources = _resources(sampler, col, params)
    if sc.idle:
        resources["kb_per_connection_slope"] = _slope_kb(growth)
    clean = {k: v for k, v in params.items() if not k.startswith("_")}
    return build_step(sc.name, clean, col, resources, sc.ttft_ms, complete=bool(result.get("complete")))


def _slope_kb(points: Sequence[tuple[int, float]]) -> float | None:
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
    return " | ".join(parts), int(live.get("sockets", 0))


def _resources(sampler: Sampler, col: Collector, params: Mapping[str, Any]) -> dict[str, Any]:
    if len(col.window) != 2:
        return {}
    start, end = col.window
    out: dict[str, Any] = {}
    cpu, rss = sampler.window("server", start, end)
    out["server_cpu_percent"], out["server_rss_mb"] = cpu, rss
    out["generator_cpu_percent"], out["generator_rss_mb"] = sampler.window("generator", start, end)
    out["simulator_cpu_percent"], _ = sampler.window("simulator", start, end)
    if "redis" in sampler.roots:
        out["redis_cpu_percent"], _ = sampler.window("redis", start, end)
    baseline = params.get("_rss_baseline_mb")
    if baseline is not None and rss is not None and params.get("sockets"):
        out["server_rss_baseline_mb"] = baseline
        sockets = col.counts.get("sockets", 0) or params["sockets"]
        out["kb_per_connection"] = round((rss - baseline) * 1024 / sockets, 1)
    return out


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
    """Run the scenario; return its report (WIRE.md)."""
    sc = opts.scenario
    keep = bool(opts.workdir)
    workdir = Path(opts.workdir) if keep else Path(tempfile.mkdtemp(prefix="collab-loadtest-"))
    workdir.mkdir(parents=True, exist_ok=True)
    procs = Processes(workdir)
    sampler = Sampler()
    sampler.start()
    steps: list[dict[str, Any]] = []
    try:
        with _sigterm_as_interrupt():
            if opts.target:
                target, model_url = opts.target.rstrip("/"), opts.model_url
                credentials = json.loads(Path(opts.credentials).read_text())
                if opts.server_pid:
                    sampler.watch("server", opts.server_pid)
                layer = "remote"
            else:
                say(f"starting the simulated model, the database and Daphne in {workdir}")
                stack = Stack(opts, procs, sampler, say)
                stack.start()
                target, model_url, credentials = stack.target, stack.model_url, stack.credentials
                layer = sc.layer
                say(f"server {target} (layer {layer}, coalescing {sc.coalesce_ms:g} ms), model {model_url}")
            rooms = credentials["rooms"]
            if opts.warmup:
                warm_up(target, rooms[0], post=not sc.idle)
            baseline = _rss_now(sampler) if sc.idle else None
            levels = _levels(sc, len(rooms))
            if not levels:
                raise RuntimeError(f"the credentials hold {len(rooms)} rooms: too few for {sc.levels}")
            for i, level in enumerate(levels, 1):
                if i > 1:
                    _settle(sampler, say)
                params = _level_params(sc, level, opts, layer)
                params["_target"] = target
                if baseline is not None:
                    # The server's size before any idle socket: freed memory is reused by the
                    # next level rather than given back, so every level is measured from here.
                    params["_rss_baseline_mb"] = baseline
                label = f"{sc.name} {i}/{len(levels)}: {level.rooms} rooms x {level.members}"
                if level.tabs > 1:
                    label += f" x {level.tabs} tabs"
                step = run_level(opts, label, rooms, level, params, procs, sampler, model_url, say)
                steps.append(step)
                say(_step_line(step))
                if sc.sweep and sc.stop_at_knee and not _step_ok(sc, step):
                    say("past the knee: the sweep stops here")
                    break
    finally:
        sampler.stop()
        procs.stop_all()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return _assemble(sc, steps)


def _settle(sampler: Sampler, say: Say, quiet_percent: float = 15.0, timeout: float = 60.0) -> None:
    """Before the next level, let the server finish what the last one left it (bounded)."""
    if "server" not in sampler.roots:
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


def _step_line(step: Mapping[str, Any]) -> str:
    p, d = step["params"], step["details"]
    lag, added = step["delivery_lag_ms"], step["added_ttft_ms"]
    if p.get("posts_per_s_per_room", 0) == 0:
        return (
            f"  {p['sockets']} idle sockets: {d['sockets']} connected,"
            f" {d['sockets_open_at_end']} open at the end;"
            f" server RSS {step['server_rss_mb']} MB ({d.get('kb_per_connection')} KB per connection,"
            f" slope {d.get('kb_per_connection_slope')} KB)"
        )
    return (
        f"  {p['rooms']} rooms, {p['concurrent_replies']} replies offered"
        f" ({d['concurrent_replies_mean']} mean):"
        f" lag p99 {lag['p99']} ms, added TTFT p50/p99 {added['p50']}/{added['p99']} ms,"
        f" lost {step['chars_lost']}, failed {step['replies_failed']}, errors {step['errors']},"
        f" server CPU {step['server_cpu_percent']}%, generator CPU {step['generator_cpu_percent']}%"
    )


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
