"""Starting the app's real processes for the tests, once for all of them: free ports, a
database of the test's own, `manage.py` on a given environment, a Daphne process
(`python -m collab.web`) up and answering, a browser's login.

Used by the end-to-end tests (tests/test_e2e.py, tests/test_budget.py), the clusters
(tests/cluster.py), the browser tests (tests/browser/conftest.py) and every test that
needs a free port. Each server is started, waited for (its /healthz) and stopped as a
user's process manager would.
"""

from __future__ import annotations

import functools
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
    "migrate",
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


def migrate(env: dict[str, str]) -> None:
    """`manage.py migrate` for that environment's database, made as a copy: the first
    test to ask migrates a template (per vendor and per state of the migrations, kept
    across runs, made once under a lock by whichever xdist process comes first), and
    every database after it is a copy of that template. A real migrate is ~5 s of CPU
    (Django's start and 26 migrations); a copy ~0.1 s, and ~50 tests make a database."""
    url = env.get("DATABASE_URL", "")
    if url:
        name = urllib.parse.urlsplit(url).path.lstrip("/")
        template = _postgres_template(url, env)
        with _maintenance(url) as conn:
            # Made empty by throwaway_database, nobody connected yet: made again from the template.
            conn.execute(f'DROP DATABASE "{name}"')
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return
    target = env.get("COLLAB_SQLITE_PATH")
    if not target:  # the default path (state/): migrated in place, as a user would
        manage(env, "migrate", "-v0")
        return
    _copy_sqlite(_sqlite_template(env), Path(target))


@functools.cache
def _migrations_key() -> str:
    """What a migrated database depends on: Django's version and the text of every
    installed app's migrations (this project's and the libraries')."""
    import hashlib

    import django
    from django.apps import apps

    digest = hashlib.sha256(django.get_version().encode())
    for app in sorted(apps.get_app_configs(), key=lambda a: a.label):
        for path in sorted((Path(app.path) / "migrations").glob("*.py")):
            digest.update(f"{app.label}/{path.name}".encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


@contextmanager
def _maintenance(url: str) -> Iterator[Any]:
    """A connection to the server's maintenance database (`postgres`), in autocommit."""
    import psycopg

    with psycopg.connect(urllib.parse.urlsplit(url)._replace(path="/postgres").geturl(), autocommit=True) as conn:
        yield conn


_TEMPLATE_LOCK = "collab tests: migrated template"  # one maker per PostgreSQL server


def _postgres_template(url: str, env: dict[str, str]) -> str:
    """The migrated template database's name on that server, made if missing. PostgreSQL
    copies a database only while nobody is connected to it: only its migrate ever is."""
    name = f"collab_template_{_migrations_key()}"
    with _maintenance(url) as conn:
        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (_TEMPLATE_LOCK,))
        try:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
                building = f"{name}_building"
                conn.execute(f'DROP DATABASE IF EXISTS "{building}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{building}"')
                at = urllib.parse.urlsplit(url)._replace(path=f"/{building}").geturl()
                manage({**env, "DATABASE_URL": at}, "migrate", "-v0")
                conn.execute(f'ALTER DATABASE "{building}" RENAME TO "{name}"')
                # Templates of earlier migrations are of no more use.
                for (old,) in conn.execute(
                    "SELECT datname FROM pg_database WHERE datname LIKE 'collab\\_template\\_%%' AND datname <> %s",
                    (name,),
                ).fetchall():
                    conn.execute(f'DROP DATABASE IF EXISTS "{old}" WITH (FORCE)')
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (_TEMPLATE_LOCK,))
    return name


def _sqlite_template(env: dict[str, str]) -> Path:
    """The migrated template SQLite file, made if missing (a file lock: one maker)."""
    import fcntl
    import tempfile

    folder = Path(tempfile.gettempdir()) / "collab-test-templates"
    folder.mkdir(exist_ok=True)
    path = folder / f"{_migrations_key()}.sqlite3"
    with (folder / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            building = path.with_suffix(f".{os.getpid()}.building")
            manage({**env, "COLLAB_SQLITE_PATH": str(building)}, "migrate", "-v0")
            _copy_sqlite(building, path)
            for leftover in folder.glob(f"{building.name}*"):
                leftover.unlink()
    return path


def _copy_sqlite(source: Path, target: Path) -> None:
    """A whole SQLite database, its write-ahead log included (SQLite's backup, not a file
    copy), written beside the target and renamed into place: never seen half made."""
    import sqlite3

    part = target.with_name(target.name + ".part")
    part.unlink(missing_ok=True)
    src, dst = sqlite3.connect(source), sqlite3.connect(part)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()
    part.replace(target)


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
