"""The production settings, as an operator starts them: each case in a fresh process with
an environment of its own (none of the test suite's: no key, HTTPS at its default).

- With DJANGO_SECRET_KEY and ALLOWED_HOSTS set, `manage.py check --deploy` is clean.
- Without DJANGO_SECRET_KEY, a server on collab.asgi refuses to start, naming the variable;
  only DJANGO_DEBUG=1 falls back to a development key.
- manage.py (`make run`) without it signs with the key kept in COLLAB_STATE_DIR, the same
  at every start, and `check --deploy` flags that key.
- COLLAB_HTTPS: on by default (http redirects to https, but not /healthz; the proxy's
  X-Forwarded-Proto counts), and COLLAB_HTTPS=0 is what `check --deploy` then warns about.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION_KEY = secrets.token_urlsafe(50)


def production_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """What /etc/collab/env holds (README "Deploying"), less the key; nothing of this run's."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "collab.settings",
            "ALLOWED_HOSTS": "chat.example.com,127.0.0.1",
            "CSRF_TRUSTED_ORIGINS": "https://chat.example.com",
            "COLLAB_SQLITE_PATH": str(tmp_path / "db.sqlite3"),
            "COLLAB_STATE_DIR": str(tmp_path / "state"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env


def run(args: list[str], env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)


def last_line(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout.strip().splitlines()[-1]


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, str(ROOT / "manage.py"), *args], env)


def test_check_deploy_is_clean_with_the_production_settings(tmp_path: Path) -> None:
    done = manage(
        production_env(tmp_path, DJANGO_SECRET_KEY=PRODUCTION_KEY), "check", "--deploy", "--fail-level", "WARNING"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout
    assert not (tmp_path / "state" / "secret_key").exists()  # the operator's key, no other


def test_plain_http_is_what_check_deploy_warns_about(tmp_path: Path) -> None:
    env = production_env(tmp_path, DJANGO_SECRET_KEY=PRODUCTION_KEY, COLLAB_HTTPS="0")
    done = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode != 0
    for check in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in done.stderr, done.stderr  # HSTS, redirect, session and CSRF cookies


def test_a_bad_https_value_is_refused(tmp_path: Path) -> None:
    env = production_env(tmp_path, DJANGO_SECRET_KEY=PRODUCTION_KEY, COLLAB_HTTPS="maybe")
    done = run([sys.executable, "-c", "import django; django.setup()"], env)
    assert done.returncode != 0
    assert "ImproperlyConfigured: COLLAB_HTTPS='maybe'" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["-c", "import django; django.setup()"], id="settings-import"),
        pytest.param(["-c", "import collab.asgi"], id="asgi-import"),
        pytest.param(["-m", "daphne", "-b", "127.0.0.1", "-p", "{port}", "collab.asgi:application"], id="daphne"),
        pytest.param(["-m", "collab.web", "-b", "127.0.0.1", "-p", "{port}", "collab.asgi:application"], id="web"),
        pytest.param(
            ["-m", "uvicorn", "--host", "127.0.0.1", "--port", "{port}", "collab.asgi:application"], id="uvicorn"
        ),
    ],
)
def test_a_server_without_the_key_refuses_to_start(tmp_path: Path, command: list[str]) -> None:
    port = str(free_port())
    # A server that did start would serve until the timeout, failing the test.
    done = run([sys.executable, *(a.replace("{port}", port) for a in command)], production_env(tmp_path), timeout=60)
    assert done.returncode != 0
    assert "ImproperlyConfigured: DJANGO_SECRET_KEY is not set" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "state" / "secret_key").exists()  # no key made up on the way


PRINT_KEY = "from django.conf import settings; print(settings.SECRET_KEY)"


def test_debug_alone_allows_a_development_key(tmp_path: Path) -> None:
    done = run(
        [sys.executable, "-c", f"import django; django.setup(); {PRINT_KEY}"],
        production_env(tmp_path, DJANGO_DEBUG="1"),
    )
    assert done.returncode == 0, done.stderr
    assert last_line(done).startswith("django-insecure-")


def test_manage_py_keeps_one_local_key_and_check_deploy_flags_it(tmp_path: Path) -> None:
    env = production_env(tmp_path)
    first, second = manage(env, "shell", "-c", PRINT_KEY), manage(env, "shell", "-c", PRINT_KEY)
    assert first.returncode == 0, first.stderr
    kept = (tmp_path / "state" / "secret_key").read_text().strip()
    assert last_line(first) == last_line(second) == kept  # a restart logs nobody out
    assert kept.startswith("django-insecure-")
    done = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode != 0
    assert "security.W009" in done.stderr, done.stderr


REQUESTS = """
import json
from django.test import Client
c = Client()
out = {}
for name, path, headers in [
    ("page", "/accounts/login/", {}),
    ("page_via_https_proxy", "/accounts/login/", {"HTTP_X_FORWARDED_PROTO": "https"}),
    ("healthz", "/healthz", {}),
]:
    r = c.get(path, HTTP_HOST="chat.example.com", **headers)
    out[name] = [r.status_code, r.headers.get("Location", ""), r.headers.get("Strict-Transport-Security", "")]
print(json.dumps(out))
"""


def test_https_by_default_redirects_plain_http_but_not_health_checks(tmp_path: Path) -> None:
    done = manage(production_env(tmp_path, DJANGO_SECRET_KEY=PRODUCTION_KEY), "shell", "-c", REQUESTS)
    assert done.returncode == 0, done.stderr
    out = json.loads(last_line(done))
    assert out["page"][:2] == [301, "https://chat.example.com/accounts/login/"]
    status, _location, hsts = out["page_via_https_proxy"]
    assert status == 200
    assert "max-age=31536000" in hsts and "includeSubDomains" in hsts
    assert out["healthz"][0] == 200  # http://127.0.0.1:PORT/healthz from the machine itself


def test_https_off_serves_plain_http(tmp_path: Path) -> None:
    env = production_env(tmp_path, DJANGO_SECRET_KEY=PRODUCTION_KEY, COLLAB_HTTPS="0")
    done = manage(env, "shell", "-c", REQUESTS)
    assert done.returncode == 0, done.stderr
    out = json.loads(last_line(done))
    assert out["page"] == [200, "", ""]
    assert out["healthz"][0] == 200
