"""Several Daphne processes on one machine, behind nginx: what `serve --workers N` runs.

The nginx site is deploy/nginx.conf, the production example an operator copies, with its
`server 127.0.0.1:...;` upstream lines and its `listen` lines rewritten for the ports
`serve` chose. Around it goes a main configuration that keeps everything nginx writes
(pid, logs, temporary files) in a state directory under .cache/, so nginx runs as a
child process of `serve`, not as the system service.

Processes are started in their own process groups: a Ctrl-C in the terminal reaches
`serve` only, which then stops them in order (nginx, the workers, the model) and gives
the workers COLLAB_DRAIN_S + 10 seconds to finish the replies in flight.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
NGINX_SITE = BASE_DIR / "deploy" / "nginx.conf"

# Stopped from the highest stage down: nothing new comes in, then the replies in flight
# finish, then the model they stream from goes.
STAGE_MODEL, STAGE_WEB, STAGE_PROXY = 0, 1, 2
STOP_GRACE_S = 10.0  # a process that is not a worker: its time to exit before SIGKILL

NGINX_MISSING = (
    "--workers {n} puts nginx in front of the workers, and nginx is not installed "
    "(looked in PATH, /usr/sbin and /usr/local/sbin). Install it (Debian, Ubuntu: "
    "`sudo apt-get install nginx`), or start the workers alone with --no-proxy."
)


def drain_seconds() -> float:
    """How long a worker finishes the replies in flight after SIGTERM (COLLAB_DRAIN_S)."""
    raw = os.environ.get("COLLAB_DRAIN_S", "")
    return float(raw) if raw.strip() else 10.0


def worker_stop_grace() -> float:
    return drain_seconds() + 10.0


def worker_ports(port: int, workers: int) -> list[int]:
    """The public port is `port`; the workers take the next `workers` ports."""
    return [port + i for i in range(1, workers + 1)]


def daphne_command(host: str, port: int, *, behind_proxy: bool = False) -> list[str]:
    command = [
        sys.executable, "-m", "collab.web", "-b", host, "-p", str(port),
        # A socket left open a day must not be closed with 1000: htmx's ws extension
        # does not reconnect after a normal close.
        "--websocket_timeout", "-1",
    ]  # fmt: skip
    if behind_proxy:
        # Client address and scheme from nginx's X-Forwarded-For/-Proto. Only for a
        # worker on loopback: anyone who can reach it directly could forge them.
        command.append("--proxy-headers")
    return [*command, "collab.asgi:application"]


def find_nginx() -> str | None:
    """nginx lives in /usr/sbin on Debian, which is not in a non-root user's PATH."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


def port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # Daphne and nginx set SO_REUSEADDR too: a socket in TIME_WAIT is no obstacle.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def redis_answers(url: str) -> str | None:
    """None when Redis at `url` answers PING, else why not."""
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except Exception as exc:
        return str(exc) or type(exc).__name__
    return None


# --- nginx --------------------------------------------------------------------------

_UPSTREAM = re.compile(r"^upstream\s+(?P<name>[\w.-]+)\s*\{\n(?P<body>.*?)^\}", re.M | re.S)
_UPSTREAM_SERVER = re.compile(r"^[ \t]*server\s+[^\s;{]+[^;{\n]*;[^\n]*\n", re.M)
_LISTEN = re.compile(r"^[ \t]*listen\s[^;\n]*;[^\n]*\n", re.M)


def render_site(site: str, host: str, port: int, upstreams: Sequence[int]) -> str:
    """deploy/nginx.conf with the servers of each upstream block (`collab` for pages,
    `collab_rooms` for the room sockets) and its listen lines replaced."""
    blocks = list(_UPSTREAM.finditer(site))
    if not any(b.group("name") == "collab" for b in blocks):
        raise ValueError("no `upstream collab { ... }` block at the start of a line")
    for block in reversed(blocks):  # from the end: the earlier offsets stay valid
        body = block.group("body")
        first = _UPSTREAM_SERVER.search(body)
        if first is None:
            raise ValueError(f"the `upstream {block.group('name')}` block lists no `server HOST:PORT;` line")
        indent = first.group(0)[: len(first.group(0)) - len(first.group(0).lstrip())]
        servers = "".join(f"{indent}server 127.0.0.1:{p};\n" for p in upstreams)
        body = body[: first.start()] + servers + _UPSTREAM_SERVER.sub("", body[first.start() :])
        site = site[: block.start("body")] + body + site[block.end("body") :]

    listens = list(_LISTEN.finditer(site))
    if not listens:
        raise ValueError("no `listen` line")
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    line = listens[0].group(0)
    indent = line[: len(line) - len(line.lstrip())]
    out, last = [], 0
    for i, match in enumerate(listens):
        out.append(site[last : match.start()])
        if i == 0:
            out.append(f"{indent}listen {address};\n")
        last = match.end()
    out.append(site[last:])
    return "".join(out)


MAIN_CONF = """\
# Written by `manage.py serve --workers {workers}` at every start; the site below is
# deploy/nginx.conf with the upstreams and the listen line of this run.
worker_processes 1;
pid {state}/nginx.pid;
error_log {state}/error.log warn;

events {{
    worker_connections 4096;
}}

http {{
    log_format collab '$remote_addr [$time_local] "$request" $status $body_bytes_sent '
                      'upstream=$upstream_addr time=$request_time';
    access_log {state}/access.log collab;
    # Every path nginx writes to, inside the state directory (Debian's defaults are
    # under /var/lib/nginx, writable by root only).
    client_body_temp_path {state}/tmp/body;
    proxy_temp_path {state}/tmp/proxy;
    fastcgi_temp_path {state}/tmp/fastcgi;
    uwsgi_temp_path {state}/tmp/uwsgi;
    scgi_temp_path {state}/tmp/scgi;

    include {state}/site.conf;
}}
"""


# Django's own mark of a key nobody chose: `check --deploy` warns about it (security.W009).
LOCAL_KEY_PREFIX = "django-insecure-"


def local_state_dir() -> Path:
    return Path(os.environ.get("COLLAB_STATE_DIR") or BASE_DIR / ".cache")


def local_secret_key(state_dir: Path) -> str:
    """The secret key `make run` signs sessions with when DJANGO_SECRET_KEY is not set:
    made once and kept in the local state folder (never in the repository, readable by
    its owner only), so a restart logs nobody out. Marked "django-insecure-", so that
    `manage.py check --deploy` says it is no production key."""
    path = state_dir / "secret_key"
    if path.exists():
        key = path.read_text().strip()
        if len(key) >= 50:
            return key
    state_dir.mkdir(parents=True, exist_ok=True)
    key = LOCAL_KEY_PREFIX + secrets.token_urlsafe(50)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    return key


def use_local_secret_key() -> Path | None:
    """manage.py, before the settings load: with DJANGO_SECRET_KEY unset, put the local
    key (above) in the environment, where the settings and every process started from
    here (`serve`'s workers) find it. Returns the key's file, or None when the variable
    was set or no key can be kept (a read-only checkout: the settings then refuse,
    naming the variable). A server started on collab.asgi never comes through here."""
    if os.environ.get("DJANGO_SECRET_KEY"):
        return None
    state = local_state_dir()
    try:
        os.environ["DJANGO_SECRET_KEY"] = local_secret_key(state)
    except OSError:
        return None
    return state / "secret_key"


def nginx_state_dir(port: int) -> Path:
    return BASE_DIR / ".cache" / f"nginx-{port}"


def write_nginx_config(state: Path, host: str, port: int, upstreams: Sequence[int]) -> Path:
    """Write site.conf and nginx.conf into `state`; return the main configuration."""
    (state / "tmp").mkdir(parents=True, exist_ok=True)
    site = render_site(NGINX_SITE.read_text(), host, port, upstreams)
    (state / "site.conf").write_text(site)
    main = state / "nginx.conf"
    main.write_text(MAIN_CONF.format(state=state, workers=len(upstreams)))
    return main


def nginx_command(nginx: str, conf: Path) -> list[str]:
    return [nginx, "-c", str(conf), "-p", str(conf.parent), "-g", "daemon off;"]


# --- the processes ------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _term_with_parent() -> None:
    """In the child before exec: SIGTERM when `serve` dies, even by SIGKILL (Linux). In
    its own process group, nothing else would stop it."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    proc: subprocess.Popen[bytes]
    name: str
    stage: int
    grace: float


class Children:
    """The processes `serve` started: watched together, stopped in stages."""

    def __init__(self) -> None:
        self.all: list[Child] = []

    def add(
        self, proc: subprocess.Popen[bytes], name: str, stage: int, grace: float = STOP_GRACE_S
    ) -> subprocess.Popen[bytes]:
        self.all.append(Child(proc, name, stage, grace))
        return proc

    def start(
        self, command: Sequence[str], name: str, stage: int, grace: float = STOP_GRACE_S, cwd: Path = BASE_DIR
    ) -> subprocess.Popen[bytes]:
        # Own process group: the terminal's Ctrl-C goes to `serve` alone, which then
        # stops this process in its turn (a worker gets SIGTERM and its drain time).
        proc = subprocess.Popen(
            list(command), cwd=cwd, stdin=subprocess.DEVNULL, process_group=0, preexec_fn=_term_with_parent
        )
        return self.add(proc, name, stage, grace)

    def watch(self) -> str:
        """Block until one of the children exits (Ctrl-C interrupts the wait); say which."""
        while True:
            pid, status = os.wait()
            child = next((c for c in self.all if c.proc.pid == pid), None)
            if child is None:
                continue  # not one of ours
            child.proc.returncode = code = os.waitstatus_to_exitcode(status)
            how = f"exited with code {code}"
            if code < 0:
                how = f"was killed by signal {-code} ({signal.strsignal(-code)})"
            return f"{child.name} {how}"

    def stop(self, say: Callable[[str], None]) -> None:
        """SIGTERM stage by stage, each given its grace; SIGKILL what outlives it. A
        Ctrl-C while waiting kills whatever is left at once."""
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # already stopping
        try:
            for stage in sorted({c.stage for c in self.all}, reverse=True):
                self._stop_stage([c for c in self.all if c.stage == stage], say)
        except KeyboardInterrupt:
            say("killing what is left ...")
            self._kill([c for c in self.all if c.proc.poll() is None])

    def _stop_stage(self, group: list[Child], say: Callable[[str], None]) -> None:
        running = [c for c in group if c.proc.poll() is None]
        for child in running:
            with contextlib.suppress(ProcessLookupError):
                child.proc.terminate()
        late: list[Child] = []
        deadline = time.monotonic() + max((c.grace for c in running), default=0.0)
        for child in running:
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                say(f"{child.name} did not stop within {child.grace:.0f} s; killing it")
                late.append(child)
        self._kill(late)

    @staticmethod
    def _kill(children: list[Child]) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                child.proc.kill()
        for child in children:
            child.proc.wait()
