"""Starting the app's real processes for the tests, once for all of them: free ports, a
database of the test's own, `manage.py` on a given environment, a Daphne process
(`python -m collab.web`) up and answering, a browser's login.

Used by the end-to-end tests (tests/test_e2e.py, tests/test_budget.py), the clusters
(tests/cluster.py), the browser tests (tests/browser/conftest.py) and every test that
needs a free port. Each server is started, waited for (its /healthz) and stopped as a
user's process manager would.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from collab import deploy
from tests.conftest import IN_CI

ROOT = Path(__file__).resolve().parent.parent

__all__ = [
    "ROOT",
    "Daphne",
    "free_port",
    "free_port_run",
    "login",
    "manage",
    "postgres_url",
    "running_daphne",
    "start_daphne",
    "stored_replies",
    "throwaway_database",
    "wait_http",
]


# --- ports ------------------------------------------------------------------------------


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick, released at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_run(count: int) -> int:
    """A port P with P .. P+count-1 all free: `serve --port` and the workers after it. Below
    the ephemeral range, where no outgoing connection takes one between the check and the bind."""
    for _ in range(100):
        base = random.randrange(20000, 32000 - count)
        if all(deploy.port_free("127.0.0.1", base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports")


# --- databases ----------------------------------------------------------------------------


def postgres_url() -> str:
    """A server to create a throwaway database on (a failure in CI when absent)."""
    import psycopg

    url = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    try:
        psycopg.connect(url, connect_timeout=2).close()
    except Exception as exc:
        if IN_CI:
            pytest.fail(f"PostgreSQL is required in CI and does not answer at {url}: {exc}")
        pytest.skip(f"no PostgreSQL at {url}")
    return url


@contextmanager
def throwaway_database(server_url: str) -> Iterator[str]:
    """A new database on that server for the block (its URL), dropped at the end."""
    import psycopg

    name = f"collab_cluster_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield re.sub(r"/[^/]*$", f"/{name}", server_url)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- manage.py and Daphne -----------------------------------------------------------------


def manage(env: dict[str, str], *args: str) -> str:
    """`manage.py ARGS` on that environment (its settings, its database); its output."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env, cwd=ROOT, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return done.stdout


def stored_replies(env: dict[str, str]) -> dict[int, dict[str, Any]]:
    """Every assistant message in that environment's database: id -> text, status, author."""
    code = (
        "import json; from collab.chat.models import Message; print(json.dumps({m.id: {'text': m.text, "
        "'status': m.status, 'author': m.author_name} for m in Message.objects.filter(role='assistant')}))"
    )
    out = manage(env, "shell", "-c", code)
    return {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def wait_http(url: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 60) -> None:
    """Until `url` answers (any HTTP status); fails at once if `proc` exits meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"process exited with {proc.returncode}") from None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # polling a server process that is starting


@dataclass
class Daphne:
    """One Daphne process serving collab.asgi on loopback."""

    url: str
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM (the app drains), then SIGKILL if it is still there after `timeout`."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def start_daphne(env: dict[str, str], port: int | None = None) -> Daphne:
    """A Daphne process (collab.web: uvloop, the eager writer) on that environment, once
    its /healthz answers."""
    port = port if port is not None else free_port()
    command = [sys.executable, "-m", "collab.web", "-b", "127.0.0.1", "-p", str(port), "collab.asgi:application"]
    server = Daphne(f"http://127.0.0.1:{port}", port, subprocess.Popen(command, env=env, cwd=ROOT))
    try:
        wait_http(f"{server.url}/healthz", server.proc)
    except BaseException:
        server.stop()
        raise
    return server


@contextmanager
def running_daphne(env: dict[str, str], port: int | None = None) -> Iterator[Daphne]:
    """:func:`start_daphne` for the block, stopped at its end."""
    server = start_daphne(env, port)
    try:
        yield server
    finally:
        server.stop()


# --- a browser's login --------------------------------------------------------------------


def login(base: str, username: str, password: str) -> str:
    """Log in as a browser does; return the session cookie."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"{base}/accounts/login/").read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    form = urllib.parse.urlencode({"username": username, "password": password, "csrfmiddlewaretoken": token.group(1)})
    opener.open(f"{base}/accounts/login/", data=form.encode())
    session = next((c.value for c in jar if c.name == "sessionid"), None)
    assert session is not None, "login failed"
    return session
