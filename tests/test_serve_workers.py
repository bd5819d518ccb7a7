"""`manage.py serve --workers N`: N Daphne processes on Redis, with or without nginx in
front (configured from deploy/nginx.conf), started, used and stopped as an operator would."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.core.management import CommandError, call_command
from websockets.asyncio.client import connect

from collab import deploy
from collab.chat import provider_env
from collab.chat.management.commands import serve
from collab.loadtest.frames import Frames
from collab.loadtest.route import Ring, room_path
from tests.conftest import IN_CI, require_redis
from tests.servers import free_port_run, login, wait_http

ROOT = Path(__file__).resolve().parent.parent


def require_nginx() -> str:
    nginx = deploy.find_nginx()
    if nginx is None:
        if IN_CI:
            pytest.fail("nginx is required in CI: .ci/run installs it (apt-get install nginx)")
        pytest.skip("nginx is not installed (apt-get install nginx)")
    return nginx


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


# --- the nginx configuration ----------------------------------------------------------


def upstreams(site: str) -> dict[str, str]:
    """Each `upstream NAME { ... }` block's body, by name."""
    return dict(re.findall(r"^upstream\s+(\S+)\s*\{\n(.*?)^\}", site, re.M | re.S))


def test_the_site_gets_the_workers_and_the_port_of_the_run() -> None:
    site = deploy.NGINX_SITE.read_text()
    servers = r"^\s*server 127\.0\.0\.1:(\d+);"
    assert [re.findall(servers, body, re.M) for body in upstreams(site).values()] == [
        ["8001", "8002", "8003", "8004"]
    ] * 2
    rendered = deploy.render_site(site, "127.0.0.1", 9000, [9001, 9002])
    # Both upstreams, pages' and sockets', get the run's workers.
    assert {name: re.findall(servers, body, re.M) for name, body in upstreams(rendered).items()} == {
        "collab": ["9001", "9002"],
        "collab_rooms": ["9001", "9002"],
    }
    assert re.findall(r"^\s*listen\s+(\S+);", rendered, re.M) == ["127.0.0.1:9000"]
    # Everything else is the production file's: the socket settings, and the comments.
    for kept in ("keepalive 32;", "proxy_read_timeout 1d;", "proxy_buffering off;", "#   listen 443 ssl http2;"):
        assert kept in rendered
    assert deploy.render_site(site, "::1", 9000, [9001]).count("listen [::1]:9000;") == 1
    with pytest.raises(ValueError):
        deploy.render_site(site.replace("upstream collab", "upstream app"), "127.0.0.1", 9000, [9001])


def test_room_sockets_are_hashed_by_room_and_pages_are_not() -> None:
    """docs/architecture/processes.md, "Rooms kept together": the socket's path names the
    room (collab/routing.py), nginx hashes it consistently; pages keep round robin."""
    from collab.routing import websocket_urlpatterns

    assert str(websocket_urlpatterns[0].pattern) == "ws/rooms/<slug:slug>/"
    rendered = deploy.render_site(deploy.NGINX_SITE.read_text(), "127.0.0.1", 9000, [9001, 9002, 9003])
    blocks = upstreams(rendered)
    rooms = [
        line.strip()
        for line in blocks["collab_rooms"].splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    # The balancing method before the servers (and before any keepalive, which nginx requires).
    assert rooms == ["hash $uri consistent;", *(f"server 127.0.0.1:{p};" for p in (9001, 9002, 9003))]
    assert "hash" not in blocks["collab"] and "keepalive 32;" in blocks["collab"]
    locations = dict(re.findall(r"^\s*location\s+([^{]+?)\s*\{\n(.*?)^\s*\}", rendered, re.M | re.S))
    assert "proxy_pass http://collab_rooms;" in locations["/ws/"]
    # A draining worker refuses the handshake with 403: the next worker on the ring takes it.
    assert re.search(r"^\s*proxy_next_upstream error timeout http_403;", locations["/ws/"], re.M)
    for where, body in locations.items():
        if where != "/ws/" and "proxy_pass" in body:
            assert "proxy_pass http://collab;" in body, where


def test_nginx_accepts_the_production_site_and_the_generated_config(tmp_path: Path) -> None:
    nginx = require_nginx()
    conf = deploy.write_nginx_config(tmp_path / "run", "127.0.0.1", 9000, [9001, 9002])
    # The committed file as an operator installs it: included in the http block.
    production = tmp_path / "production.conf"
    production.write_text(conf.read_text().replace(str(conf.parent / "site.conf"), str(deploy.NGINX_SITE)))
    for main in (conf, production):
        check = subprocess.run([nginx, "-t", "-c", str(main), "-p", str(conf.parent)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


# --- refusals before anything starts ----------------------------------------------------


@pytest.mark.parametrize(
    ("base_url", "model", "named"), [("", "", "simulated"), ("", "mine", "mine"), ("http://10.0.0.5:8000/v1", "", "")]
)
def test_the_simulated_model_is_never_named_as_the_embedded_one(
    settings: Any, monkeypatch: pytest.MonkeyPatch, base_url: str, model: str, named: str
) -> None:
    """`serve --model simulated` stands where SmolLM2 would: its replies and the room page
    must not say SmolLM2 (provider_env.is_embedded_model). A model named, or an endpoint
    of the operator's, is left alone."""
    settings.COLLAB_LLM_BASE_URL, settings.COLLAB_LLM_MODEL = base_url, model
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("COLLAB_LLM_MODEL", model)  # restored after the test, whatever serve sets
    serve.name_the_simulated_model()
    assert named == settings.COLLAB_LLM_MODEL and os.environ["COLLAB_LLM_MODEL"] == named
    assert not provider_env.is_embedded_model(provider_env.default_endpoint_settings()["default_model"])


def test_several_workers_refuse_to_start_without_redis(settings: Any) -> None:
    settings.REDIS_URL = ""
    with pytest.raises(CommandError, match="needs Redis: set REDIS_URL"):
        call_command("serve", workers=2, no_proxy=True)


@pytest.mark.redis
def test_without_nginx_it_says_how_to_install_it(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.REDIS_URL = require_redis()
    monkeypatch.setattr(deploy, "find_nginx", lambda: None)
    with pytest.raises(CommandError) as failure:
        call_command("serve", workers=2, port=free_port_run(3))
    assert "apt-get install nginx" in str(failure.value)
    assert "--no-proxy" in str(failure.value)


# --- serve --workers 2, end to end ----------------------------------------------------------


@contextmanager
def serving(
    tmp_path: Path, port: int, *args: str, sigint_ignored: bool = False
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`manage.py serve --port PORT ARGS` on a fresh SQLite database, Redis and the simulated
    model; stopped with Ctrl-C (SIGINT to its process group, as a terminal sends it) on the way out."""
    model_port = port
    while port <= model_port <= port + 2:
        model_port = free_port_run(1)
    env = {
        **os.environ,
        "REDIS_URL": require_redis(),
        "COLLAB_REDIS_PREFIX": f"serve{os.urandom(4).hex()}:",  # never another run's room 1
        "COLLAB_SQLITE_PATH": str(tmp_path / "serve.sqlite3"),
        "COLLAB_LOCAL_MODEL_URL": f"http://127.0.0.1:{model_port}/v1",
        "PYTHONUNBUFFERED": "1",
    }
    for name in ("DATABASE_URL", "DJANGO_SECRET_KEY", "COLLAB_LLM_BASE_URL", "OPENAI_API_KEY", "COLLAB_PROVIDERS"):
        env.pop(name, None)
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        serve = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "serve", "--model", "simulated", "--port", str(port), *args],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            # As a script's background job starts it (or a test runner that ignores Ctrl-C).
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None,
        )  # fmt: skip
    try:
        yield serve, log_path
    finally:
        if serve.poll() is None:  # a failed test: stop it all the same
            started = psutil.Process(serve.pid).children(recursive=True)
            os.killpg(serve.pid, signal.SIGINT)
            try:
                serve.wait(deploy.worker_stop_grace() + 20)
            except subprocess.TimeoutExpired:
                serve.kill()
                serve.wait()
            for proc in psutil.wait_procs(started, timeout=5)[1]:
                proc.kill()
        print(log_path.read_text(errors="replace"))


def stop_with_ctrl_c(serve: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """Ctrl-C; wait for serve to exit; return what it had started that is still running."""
    started = psutil.Process(serve.pid).children(recursive=True)
    assert started, "serve started no processes"
    os.killpg(serve.pid, signal.SIGINT)
    assert serve.wait(deploy.worker_stop_grace() + 20) == 0
    _gone, alive = psutil.wait_procs(started, timeout=1)
    return [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.e2e
@pytest.mark.redis
def test_two_workers_without_a_proxy(tmp_path: Path) -> None:
    port = free_port_run(3)
    workers = [f"http://127.0.0.1:{port + 1}", f"http://127.0.0.1:{port + 2}"]
    with serving(tmp_path, port, "--workers", "2", "--no-proxy") as (serve, log):
        for url in workers:
            wait_http(f"{url}/healthz", serve)
        for url in workers:
            with urllib.request.urlopen(f"{url}/healthz", timeout=5) as response:
                assert response.status == 200
        assert not listening(port), "--no-proxy started something on the public port"
        while "Ctrl-C stops everything" not in log.read_text():
            assert serve.poll() is None
            time.sleep(0.1)  # the banner follows the last health check by a few lines
        printed = log.read_text()
        assert all(f"{url}/" in printed for url in workers)
        assert "PostgreSQL (DATABASE_URL) is the production choice" in printed
        left = stop_with_ctrl_c(serve)
    assert left == [], f"still running after serve stopped: {left}"
    assert not any(listening(port + i) for i in (1, 2))


@pytest.mark.e2e
@pytest.mark.redis
def test_ctrl_c_stops_serve_even_when_it_was_started_ignoring_it(tmp_path: Path) -> None:
    port = free_port_run(1)
    with serving(tmp_path, port, sigint_ignored=True) as (serve, log):
        wait_http(f"http://127.0.0.1:{port}/healthz", serve)
        while "Ctrl-C stops everything" not in log.read_text():
            assert serve.poll() is None
            time.sleep(0.1)  # the banner follows the health check by a few lines
        left = stop_with_ctrl_c(serve)
    assert left == [], f"still running after serve stopped: {left}"
    assert "stopping ..." in log.read_text()


async def snapshot_through(base: str, session: str) -> Frames:
    frames = Frames()
    ws_url = base.replace("http", "ws") + "/ws/rooms/demo/"
    async with connect(ws_url, origin=base, additional_headers={"Cookie": f"sessionid={session}"}) as ws:  # type: ignore[arg-type]
        async with asyncio.timeout(20):
            while frames.snapshots < 1:
                frames.feed(await ws.recv(), time.monotonic())
    return frames


@pytest.mark.e2e
@pytest.mark.redis
def test_two_workers_behind_nginx(tmp_path: Path) -> None:
    require_nginx()
    port = free_port_run(3)
    base = f"http://127.0.0.1:{port}"
    state = deploy.nginx_state_dir(port)
    try:
        with serving(tmp_path, port, "--workers", "2") as (serve, _log):
            wait_http(f"{base}/healthz", serve)
            for p in (port + 1, port + 2):
                with urllib.request.urlopen(f"http://127.0.0.1:{p}/healthz", timeout=5) as response:
                    assert response.status == 200

            session = login(base, "demo", "collab-demo")
            # Round robin: each worker in turn must know the session the other made.
            opener = urllib.request.build_opener()
            opener.addheaders = [("Cookie", f"sessionid={session}")]
            for _ in range(4):
                with opener.open(f"{base}/", timeout=5) as response:
                    assert urllib.parse.urlparse(response.geturl()).path == "/", "logged out by the other worker"
            served_by = set(re.findall(r"upstream=(\S+)", (state / "access.log").read_text()))
            assert served_by == {f"127.0.0.1:{port + 1}", f"127.0.0.1:{port + 2}"}

            frames = asyncio.run(snapshot_through(base, session))
            assert frames.snapshots == 1

            # Each room's sockets go where the load generator's ring (collab/loadtest/route.py)
            # says nginx sends them: 24 rooms that do not exist (Daphne answers 404, which
            # nginx does not retry elsewhere), each on the one worker the ring names.
            workers = [f"127.0.0.1:{port + 1}", f"127.0.0.1:{port + 2}"]
            slugs = [f"ring-{i}" for i in range(24)]
            for slug in slugs:
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(f"{base}{room_path(slug)}", timeout=5)
                refused.value.close()
                assert refused.value.code == 404
            log_lines = (state / "access.log").read_text().splitlines()
            seen = {
                m[1]: m[2] for m in (re.search(r"GET /ws/rooms/([^/]+)/ .* upstream=(\S+)", x) for x in log_lines) if m
            }
            ring = Ring(workers)
            assert {slug: seen[slug] for slug in slugs} == {
                slug: workers[ring.server_of(room_path(slug))] for slug in slugs
            }
            assert len({seen[slug] for slug in slugs}) == 2  # both workers hold rooms

            nginx = [p for p in psutil.Process(serve.pid).children(recursive=True) if p.name() == "nginx"]
            assert len(nginx) >= 2, "expected nginx's master and worker"
            left = stop_with_ctrl_c(serve)
        assert left == [], f"still running after serve stopped: {left}"
        assert not any(listening(port + i) for i in (0, 1, 2))
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_the_local_secret_key_is_made_once_and_kept_private(tmp_path: Path) -> None:
    """`make run` without DJANGO_SECRET_KEY: a restart finds the same key, so nobody is
    logged out; the file is its owner's alone."""
    first = deploy.local_secret_key(tmp_path / "state")
    assert deploy.local_secret_key(tmp_path / "state") == first
    assert len(first) >= 50
    assert (tmp_path / "state" / "secret_key").stat().st_mode & 0o777 == 0o600
    assert deploy.local_secret_key(tmp_path / "other") != first
