"""The WebSocket origin check (docs/wire.md, "WebSocket"; README "Security").

A browser sends the page's origin, scheme, host and port, with every socket it opens, and
a page elsewhere cannot forge it. Channels' check compares host names only when the
allowed entry has no scheme (ALLOWED_HOSTS has none): `http://127.0.0.1:1`, another site
on this machine, passed as `127.0.0.1`. Here an origin is let in only when it is this site
whole:

- the scheme the deployment serves (https with COLLAB_HTTPS, else http), a host of
  ALLOWED_HOSTS ("*" never counts), and that scheme's default port, or the very host and
  port the socket came to (its Host header, itself one of ALLOWED_HOSTS): `make run` on
  :8000, a worker behind nginx, which passes the browser's Host on;
- or exactly one of CSRF_TRUSTED_ORIGINS (scheme, host, port; `*.example.com` matches
  its subdomains, as Django's CSRF check reads it).

Settings are read at each handshake, so a test (or a reload) that changes them counts.
"""

from __future__ import annotations

from typing import Any, NamedTuple
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

DEFAULT_PORTS = {"http": 80, "https": 443}


class Origin(NamedTuple):
    scheme: str
    host: str  # lower case; an IPv6 address in brackets, as in a Host header
    port: int


def parse(value: str) -> Origin | None:
    """`scheme://host[:port]` with an http(s) scheme and nothing else (no path, no user),
    or None: "null", an opaque or malformed origin."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), parts.hostname
    if scheme not in DEFAULT_PORTS or not host or parts.username is not None or parts.password is not None:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    if ":" in host:  # IPv6: bracketed, as ALLOWED_HOSTS and Host headers write it
        host = f"[{host}]"
    return Origin(scheme, host, port if port is not None else DEFAULT_PORTS[scheme])


def served_scheme() -> str:
    return "https" if settings.COLLAB_HTTPS else "http"


def _allowed_hosts() -> list[str]:
    return [h for h in settings.ALLOWED_HOSTS if h != "*"]


def _own(host_header: str | None, scheme: str) -> tuple[str, int] | None:
    """The host and port the socket came to, if its Host header names a host we serve."""
    if not host_header:
        return None
    domain, port = split_domain_port(host_header)
    if not domain or not validate_host(domain, _allowed_hosts()):
        return None
    try:
        return domain, int(port) if port else DEFAULT_PORTS[scheme]
    except ValueError:
        return None


def _trusted(origin: Origin) -> bool:
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        trusted = parse(entry)
        if trusted is None or (trusted.scheme, trusted.port) != (origin.scheme, origin.port):
            continue
        if trusted.host.startswith("*."):  # the domain and its subdomains, as Django's CSRF check
            if is_same_domain(origin.host, trusted.host[1:]):
                return True
        elif trusted.host == origin.host:
            return True
    return False


def allowed(origin_header: str | None, host_header: str | None = None) -> bool:
    """Whether a socket opened with these Origin and Host headers comes from this site."""
    origin = parse(origin_header) if origin_header is not None else None
    if origin is None:
        return False
    if _trusted(origin):
        return True
    scheme = served_scheme()
    if origin.scheme != scheme:
        return False
    if origin.port == DEFAULT_PORTS[scheme] and validate_host(origin.host, _allowed_hosts()):
        return True
    return _own(host_header, scheme) == (origin.host, origin.port)


class OriginValidator:
    """ASGI middleware for WebSockets: the handshake of a socket whose origin is not this
    site is refused (403), before any session or consumer is touched."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        origin = host = None
        for name, value in scope.get("headers", []):
            if name == b"origin":
                origin = value.decode("latin1")
            elif name == b"host":
                host = value.decode("latin1")
        if allowed(origin, host):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)
