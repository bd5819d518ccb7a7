"""HTTP as the simulated users speak it: the login form, and a direct call to the model.

Plain ``http.client``: blocking in a thread, cooperative under gevent's monkey patching.
"""

from __future__ import annotations

import http.client
import json
import re
import time
import uuid
from urllib.parse import urlencode, urlsplit

__all__ = ["LoginError", "http_login", "probe_model_ttft"]


class LoginError(Exception):
    pass


def _cookie(headers: http.client.HTTPMessage, name: str) -> str | None:
    for value in headers.get_all("Set-Cookie") or []:
        first = value.split(";", 1)[0]
        key, _, val = first.partition("=")
        if key.strip() == name:
            return val.strip()
    return None


def http_login(target: str, username: str, password: str, timeout: float = 60.0) -> str:
    """Log in through the login form as a browser does; return the ``sessionid`` cookie."""
    parts = urlsplit(target)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    try:
        conn.request("GET", "/accounts/login/")
        resp = conn.getresponse()
        page = resp.read().decode("utf-8", "replace")
        csrf = _cookie(resp.headers, "csrftoken")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        if resp.status != 200 or csrf is None or token is None:
            raise LoginError(f"login page: HTTP {resp.status}")
        origin = target.rstrip("/")
        body = urlencode({"username": username, "password": password, "csrfmiddlewaretoken": token.group(1)})
        conn.request(
            "POST",
            "/accounts/login/",
            body=body,
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Cookie": f"csrftoken={csrf}",
                "Origin": origin,
                "Referer": origin + "/accounts/login/",
            },
        )
        resp = conn.getresponse()
        resp.read()
        session = _cookie(resp.headers, "sessionid")
        if resp.status != 302 or not session:
            raise LoginError(f"login of {username}: HTTP {resp.status}")
        return session
    finally:
        conn.close()


_CONTENT = re.compile(rb'"content":"[^"]')


def probe_model_ttft(model_url: str, model: str, timeout: float = 30.0) -> float:
    """One streamed completion straight to the model; seconds to its first content token."""
    parts = urlsplit(model_url)
    path = parts.path.rstrip("/") + "/chat/completions"
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": f"probe {uuid.uuid4().hex}"}],
            "stream": True,
            "max_tokens": 1,
        }
    ).encode()
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    try:
        start = time.perf_counter()
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise OSError(f"model answered HTTP {resp.status}")
        seen = b""
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                raise OSError("model stream ended before a token")
            seen = seen[-32:] + chunk
            if _CONTENT.search(seen):
                first = time.perf_counter() - start
                break
        while resp.read1(65536):
            pass
        return first
    finally:
        conn.close()
