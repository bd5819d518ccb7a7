"""Files through a real Daphne process (collab.asgi): a member's upload over HTTP with the
session and the CSRF header, a document read in its child process from the server, the
file served back with its headers, and a request past the cap refused by its length
(collab/bodycap.py)."""

from __future__ import annotations

import http.client
import http.cookiejar
import json
import os
import re
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import file_samples as samples
from tests.servers import manage, migrate, running_daphne

pytestmark = pytest.mark.e2e

SETUP = """
from django.contrib.auth.models import User
from collab.chat.services import rooms
alice = User.objects.create_user("alice", password="pw-alice-123")
rooms.create_room(alice, "Lab")
"""


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("files-e2e")


@pytest.fixture(scope="module")
def server(media: Path) -> Iterator[str]:
    folder = media
    env = {
        **os.environ,
        "COLLAB_SQLITE_PATH": str(folder / "db.sqlite3"),
        "COLLAB_MEDIA_ROOT": str(folder / "media"),
        "DJANGO_SETTINGS_MODULE": "collab.settings",
        "COLLAB_MAX_FILE_BYTES": str(1 << 20),
        "COLLAB_LLM_BASE_URL": "http://127.0.0.1:9/v1",  # no reply is asked for
        "COLLAB_LLM_MODEL": "none",
    }
    env.setdefault("DJANGO_SECRET_KEY", "test-files-e2e-key")
    env.setdefault("COLLAB_HTTPS", "0")
    for name in ("DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    migrate(env)
    manage(env, "shell", "-c", SETUP)
    with running_daphne(env) as daphne:
        yield daphne.url


def signed_in(base: str) -> tuple[str, str]:
    """Log in as a browser does: the session and CSRF cookies."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"{base}/accounts/login/").read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    form = {"username": "alice", "password": "pw-alice-123", "csrfmiddlewaretoken": token.group(1)}
    opener.open(f"{base}/accounts/login/", data=urllib.parse.urlencode(form).encode())
    cookies = {c.name: c.value for c in jar}
    return cookies["sessionid"], cookies["csrftoken"]


def multipart(name: str, data: bytes) -> tuple[str, bytes]:
    boundary = uuid.uuid4().hex
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    return f"multipart/form-data; boundary={boundary}", head + data + f"\r\n--{boundary}--\r\n".encode()


def request(base: str, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> Any:
    host = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
    try:
        connection.request(method, path, body=body or None, headers=headers)
        response = connection.getresponse()
        response.body = response.read()
    finally:
        connection.close()
    return response


def test_an_upload_through_daphne_is_read_and_served(server: str, media: Path) -> None:
    session, csrf = signed_in(server)
    cookies = f"sessionid={session}; csrftoken={csrf}"
    content_type, body = multipart("spec.pdf", samples.pdf(["served by daphne", "page two"]))
    headers = {"Cookie": cookies, "X-CSRFToken": csrf, "Content-Type": content_type, "Origin": server}
    answer = request(server, "POST", "/r/lab/files/", headers, body)
    assert answer.status == 201, answer.body
    made = json.loads(answer.body)
    assert (made["kind"], made["content_type"], made["pages"]) == ("document", "application/pdf", 2)

    served = request(server, "GET", made["url"], {"Cookie": cookies})
    assert served.status == 200 and served.body.startswith(b"%PDF")
    assert served.getheader("Content-Type") == "application/pdf"
    assert served.getheader("X-Content-Type-Options") == "nosniff"
    assert served.getheader("Content-Disposition") == 'inline; filename="spec.pdf"'
    assert request(server, "GET", made["url"], {}).status == 302  # to the login page
    stored = [p for p in (media / "media" / "files").rglob("*") if p.is_file()]
    assert len(stored) == 1 and re.fullmatch(r"[0-9a-f]{32}", stored[0].name)
    assert stored[0].read_bytes() == served.body


def test_a_request_past_the_cap_is_refused_unparsed(server: str) -> None:
    """Twice the cap (1 MB here): Daphne receives it whole (Twisted reads a body before the
    application sees the request), then collab answers 413 from its length alone."""
    session, csrf = signed_in(server)
    content_type, body = multipart("big.txt", b"a" * (2 << 20))
    headers = {"Cookie": f"sessionid={session}; csrftoken={csrf}", "X-CSRFToken": csrf, "Content-Type": content_type}
    answer = request(server, "POST", "/r/lab/files/", headers, body)
    assert answer.status == 413
    assert json.loads(answer.body)["error"]["code"] == "file.too_large"
