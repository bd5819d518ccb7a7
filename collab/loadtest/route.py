"""Which server process a member's room socket goes to in a load test with several.

`spread`: member i of every room connects to process i mod N, so every room spans every
process (each frame is received by all N). `hash`: every socket of a room goes to the
process its WebSocket path hashes to, as nginx's `hash $uri consistent;` places it in the
deployment (deploy/nginx.conf, docs/architecture/processes.md, "Rooms kept together").

The ring follows nginx's consistent hash (ngx_http_upstream_hash_module, ketama): 160
points per server, each the CRC-32 of "HOST\\0PORT" and the previous point, and a key goes
to the first point at or after its CRC-32. Written from that description, it names the
worker a running nginx picks: tests/test_serve_workers.py compares them room by room
through `serve --workers 2` and nginx's access log.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Sequence
from typing import Literal

__all__ = ["ROUTES", "Ring", "Route", "room_path"]

Route = Literal["spread", "hash"]
ROUTES: tuple[Route, ...] = ("spread", "hash")
POINTS_PER_SERVER = 160  # nginx's, per unit of weight


def room_path(slug: str) -> str:
    """The room socket's path (collab/routing.py): nginx's $uri for its handshake."""
    return f"/ws/rooms/{slug}/"


def _host_port(server: str) -> tuple[bytes, bytes]:
    """ "127.0.0.1:8001" or "http://127.0.0.1:8001/" as nginx splits a server's address."""
    address = server.split("://", 1)[-1].rstrip("/")
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return address.encode(), b""
    return host.encode(), port.encode()


class Ring:
    """A consistent-hash ring over `servers` (addresses, in upstream order)."""

    def __init__(self, servers: Sequence[str]) -> None:
        if not servers:
            raise ValueError("a ring needs at least one server")
        points: dict[int, int] = {}
        for index, server in enumerate(servers):
            host, port = _host_port(server)
            base = zlib.crc32(host + b"\0" + port)
            prev = 0
            for _ in range(POINTS_PER_SERVER):
                point = zlib.crc32(prev.to_bytes(4, "little"), base)
                points.setdefault(point, index)  # equal points: the first server keeps it
                prev = point
        self.hashes = sorted(points)
        self.owners = [points[h] for h in self.hashes]

    def server_of(self, key: str) -> int:
        """The index of the server `key` goes to."""
        at = bisect.bisect_left(self.hashes, zlib.crc32(key.encode()))
        return self.owners[at % len(self.hashes)]
