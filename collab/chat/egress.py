"""Where staff-configured outbound calls may go, and with which keys (README "Security";
issue 33): the agents' HTTP tools (replies/http_tools.py) and MCP servers over HTTP
(services/mcp.py hands `client()` to the mcp SDK; docs/architecture/agents.md, "MCP servers").

Addresses. A call never connects to a loopback, private, link-local (cloud metadata:
169.254.169.254, fd00:ec2::254), shared, reserved, multicast or unspecified address, nor
to an IPv6 address that embeds one (::ffff:127.0.0.1, 6to4, NAT64), unless the operator
allowed its network (COLLAB_TOOL_ALLOWED_NETWORKS, e.g. `10.1.2.0/24,127.0.0.1/32`).
The check is made on each address the client is about to connect to, after resolving,
inside the HTTP client's own network backend (`GuardedBackend`): a name that resolves to
a public address when staff save it and to 127.0.0.1 at call time (DNS rebinding) is
refused at call time, and the connection goes to the very address that was checked. No
proxy and no environment settings are used (a proxy would connect on the call's behalf).

Keys. A tool's key variable is its own: `COLLAB_TOOL_KEY_*`, or a name the operator lists
in COLLAB_TOOL_KEY_VARIABLES; never `DJANGO_*`. The providers' key variables
(COLLAB_LLM_API_KEY, OPENAI_API_KEY, COLLAB_KEY_*) are refused unless listed there:
staff who register a tool cannot send the model provider's key to a URL of their choosing.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Iterable
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import httpcore2
import httpx2
from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

TOOL_KEY_PREFIX = "COLLAB_TOOL_KEY_"
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}


class Refused(Exception):
    """A connection the egress policy does not allow; its text says why (no secret in it)."""


@lru_cache(maxsize=8)
def _networks(spec: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(n, strict=False) for n in spec)


def allowed_networks() -> tuple[Network, ...]:
    """The networks staff allowed (settings.COLLAB_TOOL_ALLOWED_NETWORKS, checked at start-up)."""
    return _networks(tuple(settings.COLLAB_TOOL_ALLOWED_NETWORKS))


def _embedded(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, 6to4, NAT64), if any."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def kind(ip: IPAddress) -> str:
    """What an address is, in words, for a refusal."""
    inner = _embedded(ip) or ip
    if inner in _METADATA or ip in _METADATA:
        return "the cloud metadata address"
    for attribute, words in (
        ("is_loopback", "a loopback address"),
        ("is_unspecified", "the unspecified address"),
        ("is_link_local", "a link-local address"),
        ("is_multicast", "a multicast address"),
        ("is_private", "a private address"),
        ("is_reserved", "a reserved address"),
    ):
        if getattr(inner, attribute):
            return words
    return "not a public address"


def address_allowed(ip: IPAddress) -> bool:
    """Public (globally reachable, not multicast, embedding no other address) or in a
    network staff allowed."""
    if any(ip in net for net in allowed_networks() if net.version == ip.version):
        return True
    inner = _embedded(ip)
    if inner is not None:
        return address_allowed(inner)
    return ip.is_global and not ip.is_multicast


def refusal(host: str, ip: IPAddress) -> str:
    shown = host if host == str(ip) else f"{host} ({ip})"
    return (
        f"{shown} is {kind(ip)}; outbound calls go to public addresses only, unless the operator "
        "allows the network in COLLAB_TOOL_ALLOWED_NETWORKS"
    )


def url_error(url: str) -> str | None:
    """Why a URL can never be called as written (an address literal, or localhost, that the
    policy refuses), else None. A name is checked again at each call, as it resolves then."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return "not a URL"
    if host == "localhost" or host.endswith(".localhost"):
        host_ip: IPAddress = ipaddress.ip_address("127.0.0.1")
    else:
        try:
            host_ip = ipaddress.ip_address(host)
        except ValueError:
            return None
    return None if address_allowed(host_ip) else refusal(host, host_ip)


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to now, in the resolver's order, each once."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: dict[IPAddress, None] = {}
    for _family, _type, _proto, _name, sockaddr in infos:
        seen.setdefault(ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]), None)
    return list(seen)


class GuardedBackend(httpcore2.AsyncNetworkBackend):
    """httpcore's network backend, resolving each name itself and connecting only to the
    addresses the policy allows, by address (TLS still names the host: httpcore passes
    the origin's name for SNI and certificate checks)."""

    def __init__(self) -> None:
        self._inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                addresses = await resolve(host, port)
        except TimeoutError:
            raise httpcore2.ConnectTimeout(f"resolving {host} took longer than {timeout} s") from None
        except OSError as exc:
            raise httpcore2.ConnectError(f"{host} does not resolve ({exc.strerror or exc})") from None
        allowed = [ip for ip in addresses if address_allowed(ip)]
        if not allowed:
            raise Refused(refusal(host, addresses[0]) if addresses else f"{host} resolves to no address")
        failure: Exception | None = None
        for ip in allowed:
            try:
                return await self._inner.connect_tcp(
                    str(ip), port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise Refused("outbound calls go over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class GuardedTransport(httpx2.AsyncHTTPTransport):
    """httpx's transport on a connection pool of its own whose every connection goes
    through GuardedBackend; no proxy, nothing from the environment."""

    def __init__(self) -> None:
        context = _ssl_context()
        super().__init__(verify=context, trust_env=False)
        self._pool = httpcore2.AsyncConnectionPool(ssl_context=context, network_backend=GuardedBackend())


@lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    """One TLS context for every call: making one loads the CA bundle, 35 ms of CPU on this
    project's machine in its slow state, which a context per call (twice: the transport
    makes its own) spent on the event loop at every tool call (docs/benchmarks.md)."""
    return httpx2.create_ssl_context(trust_env=False)


def client(timeout: httpx2.Timeout) -> httpx2.AsyncClient:
    """An HTTP client under the egress policy, for one call (it follows no redirect)."""
    return httpx2.AsyncClient(transport=GuardedTransport(), timeout=timeout, follow_redirects=False, trust_env=False)


def tool_key_variable_allowed(name: str) -> bool:
    """Whether a tool may send the value of this environment variable as its key."""
    if not name:
        return True
    if name.startswith("DJANGO_"):  # Django's own secrets, whatever the list says
        return False
    return name.startswith(TOOL_KEY_PREFIX) or name in settings.COLLAB_TOOL_KEY_VARIABLES


def tool_key_variable_error(name: str) -> str | None:
    if tool_key_variable_allowed(name):
        return None
    return (
        f"{name} is not an allowed tool key variable: name it {TOOL_KEY_PREFIX}..., or have the operator "
        "list it in COLLAB_TOOL_KEY_VARIABLES (a provider's key is not a tool's)."
    )
