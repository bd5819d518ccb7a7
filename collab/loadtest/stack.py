"""The servers a load-test run starts on loopback, and the processes it starts.

Every process is started in its own session (process group) and stopped by that
group's id on the way out, whatever the way out is (end, error, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from collab.loadtest.client import http_login
from collab.loadtest.options import Options
from collab.loadtest.sampler import Sampler
from collab.loadtest.wsclient import WebSocket

__all__ = ["BASE_DIR", "IDLE_ROOMS", "Processes", "Stack", "redis_answers", "warm_up"]

BASE_DIR = Path(__file__).resolve().parents[2]
PASSWORD = "load-" + "pw-1234"  # seeded accounts on a throwaway database
IDLE_ROOMS = 20  # the idle scenario spreads its sockets over this many rooms of `members`
_STOP_TIMEOUT_S = 10.0
# The stack sets every other COLLAB_ variable itself; these (the model client's HTTP
# transport, collab/llm/client.py; early requests, chat/replies/early.py) are the operator's, to
# compare both ways under load.
PASSED_THROUGH = ("COLLAB_LLM_HTTP", "COLLAB_EARLY_REQUESTS")
_START_TIMEOUT_S = 90.0

Say = Callable[[str], None]


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


def wait_http(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = _START_TIMEOUT_S) -> None:
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


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except Exception:
        return False


# --- the servers on loopback -------------------------------------------------------------------


class Stack:
    """Redis (if the layer needs it), the simulated model, a seeded database and Daphne:
    ``scenario.processes`` Daphne processes, each on its own port, on the same Redis, the
    same database and the same ``DJANGO_SECRET_KEY`` (a session opened on one is valid on
    every other)."""

    def __init__(self, opts: Options, procs: Processes, sampler: Sampler, say: Say) -> None:
        self.opts = opts
        self.sc = opts.scenario
        self.procs = procs
        self.sampler = sampler
        self.say = say
        self.workdir = procs.workdir
        self.env: dict[str, str] = {}
        self.targets: list[str] = []  # one base URL per server process
        self.model_url = ""
        self.mcp_url = ""  # `--mcp http`: the load test's MCP server
        self.redis_url = ""
        self.metrics_token = secrets.token_urlsafe(16)  # GET /metrics of each server process
        self.credentials: dict[str, Any] = {}
        self.commands: dict[str, Any] = {}  # name -> (cmd, env): the storm starts them again

    @property
    def target(self) -> str:
        return self.targets[0] if self.targets else ""

    def _base_env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k in PASSED_THROUGH
            or (not k.startswith(("COLLAB_", "DJANGO_")) and k not in ("DATABASE_URL", "REDIS_URL"))
        }
        env["PYTHONPATH"] = os.pathsep.join([str(BASE_DIR), *filter(None, [env.get("PYTHONPATH", "")])])
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def start(self) -> None:
        sc = self.sc
        env = self._base_env()
        py = sys.executable
        n = max(1, sc.processes)
        if n > 1 and sc.layer == "memory":
            raise RuntimeError(
                f"{n} server processes need a Redis channel layer (pubsub or core):"
                " the in-memory layer does not reach across processes"
            )
        # The channel layer.
        if sc.layer != "memory":
            self.redis_url = self._start_redis(env)
            env["REDIS_URL"] = self.redis_url
            # Keys and channel names of this run alone: on a Redis it shares (`--redis URL`,
            # `env`), another run or a deployment keeps the default prefix and its own room 1,
            # and each would receive the other's frames as its own.
            env["COLLAB_REDIS_PREFIX"] = f"loadtest-{os.urandom(4).hex()}:"
            self.sampler.watch_redis(self.redis_url)
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
        if sc.mcp:
            self._start_mcp(env)
        # The app's settings.
        env.update(
            {
                # `manage.py loadtest --settings M` runs the server with those settings too.
                "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "collab.settings"),
                # One key for every process this run starts (the servers and loadtest_sessions).
                "DJANGO_SECRET_KEY": secrets.token_urlsafe(32),
                "COLLAB_METRICS_TOKEN": self.metrics_token,
                "COLLAB_LLM_BASE_URL": self.model_url,
                "COLLAB_LLM_MODEL": "sim",
                "COLLAB_COALESCE_MS": f"{sc.coalesce_ms:g}",
                # The load test posts faster than a person: lift the per-member rate limit.
                "COLLAB_POST_BURST": "100000",
                "COLLAB_POST_REFILL_S": "0.001",
                "COLLAB_LOG_LEVEL": "WARNING",
                "ALLOWED_HOSTS": "127.0.0.1,localhost",
                "COLLAB_HTTPS": "0",  # plain http on loopback
                "COLLAB_STATIC_ROOT": str(self.workdir / "static"),
                # The files scenario's uploads: the run's folder, removed with it; the
                # posting rate is lifted above, the upload rate is too.
                "COLLAB_MEDIA_ROOT": str(self.workdir / "media"),
                "COLLAB_UPLOAD_REFILL_S": "0.001",
            }
        )
        if sc.name == "storm":  # the restarted server drains this long (collab/chat/lifecycle.py)
            env["COLLAB_DRAIN_S"] = f"{self.opts.storm_drain_s:g}"
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
            "--prefix", "load", *(["--agents"] if sc.agent_script else []),
            *(["--mcp", self.mcp_url or "stdio"] if sc.mcp else []),
        )  # fmt: skip
        if sc.login == "session":
            with_sessions = self.workdir / "seed-sessions.json"
            self._manage("loadtest_sessions", "--credentials", str(seed), "--output", str(with_sessions))
            seed = with_sessions
        self.credentials = json.loads(seed.read_text())
        ports: list[int] = []
        while len(ports) < n:
            port = free_port()
            if port not in ports:
                ports.append(port)
        daphnes = []
        for i, port in enumerate(ports):
            name = "daphne" if n == 1 else f"daphne-{i}"
            cmd = [py, "-m", "collab.web", "-b", "127.0.0.1", "-p", str(port), self.opts.asgi_app]
            daphnes.append((name, self.procs.start(name, cmd, env)))
            self.commands[name] = (cmd, dict(env))
            self.targets.append(f"http://127.0.0.1:{port}")
        for i, ((name, daphne), target) in enumerate(zip(daphnes, self.targets, strict=True)):
            wait_http(target + "/healthz", daphne, name)
            self.sampler.watch(f"server/{i}", daphne.pid, group="server")

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

    def _announced_url(
        self,
        proc: subprocess.Popen[bytes],
        name: str = "simulator",
        pattern: str = r"simulated model on (http://\S+/v1)",
    ) -> str:
        deadline = time.monotonic() + _START_TIMEOUT_S
        log = self.workdir / f"{name}.log"
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace") if log.exists() else ""
            m = re.search(pattern, text)
            if m:
                if name == "simulator":
                    wait_http(m.group(1) + "/models", proc, "the simulator")
                return m.group(1)  # the MCP server announces its port once it accepts connections
            if proc.poll() is not None:
                raise RuntimeError(f"the {name} exited:\n{text[-2000:]}")
            time.sleep(0.05)  # polling a starting process's log
        raise RuntimeError(f"the {name} did not start")

    def _start_mcp(self, env: dict[str, str]) -> None:
        """`--mcp`: the agents' tools are the load test's MCP server's (docs/loadtest.md). Over
        HTTP it runs here, on loopback, which the servers are allowed to reach; over stdio
        each call starts it as a child of the server process."""
        if self.sc.mcp == "stdio":
            env["COLLAB_MCP_STDIO"] = "1"
            return
        cmd = [sys.executable, "-m", "collab.loadtest.mcp_server", "--port", "0"]
        proc = self.procs.start("mcp", cmd, env)
        self.mcp_url = self._announced_url(proc, "mcp", r"mcp server on (http://\S+/mcp)")
        self.sampler.watch("mcp", proc.pid)
        env["COLLAB_TOOL_ALLOWED_NETWORKS"] = "127.0.0.1/32"

    def _start_redis(self, env: Mapping[str, str]) -> str:
        if self.opts.redis == "env":
            url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
            if not redis_answers(url):
                raise RuntimeError(f"no Redis answers at {url}")
            return url
        if self.opts.redis != "start":
            if not redis_answers(self.opts.redis):
                raise RuntimeError(f"no Redis answers at {self.opts.redis}")
            return self.opts.redis
        binary = shutil.which("redis-server")
        if binary is None:
            fallback = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
            if redis_answers(fallback):
                self.say(f"no redis-server to start: using {fallback} (share it with nothing else)")
                return fallback
            raise RuntimeError("the scenario needs Redis: install redis-server or pass --redis URL")
        port = free_port()
        cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        proc = self.procs.start("redis", cmd, env)
        url = f"redis://127.0.0.1:{port}/0"
        self.commands["redis"], self.commands["redis_url"] = (cmd, dict(env)), url
        deadline = time.monotonic() + 20
        while not redis_answers(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start:\n{self.procs.log_tail('redis')}")
            time.sleep(0.05)  # polling a starting server
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
