"""A room frame as WebSocket bytes, built once for every socket of the room.

Daphne's WebSocket protocol (autobahn) builds each frame anew for each socket:
`sendMessage` checks its arguments and state, counts traffic, looks for compression and
fragmentation, then `sendFrame` packs the header and `sendData` writes it, once per
member per frame: a share of the server's CPU worth sparing
(docs/benchmarks/2026-12-04.md#b-frame-bytes-once). A server's text frame is the same
bytes for every socket that negotiated no compression (Daphne accepts none) and is not
masked (servers never mask): the header and payload
are joined here once per room frame, and `outbox.Outbox.offer` hands them to the
socket's transport as they are, where autobahn's own sending would have written the
same bytes. A socket where that does not hold is sent the payload the usual way.
"""

from __future__ import annotations

import struct

__all__ = ["payload", "payload_size", "text_frame"]

_FIN_TEXT = 0x81  # FIN, no RSV bits, opcode 1 (text)


def text_frame(data: bytes) -> bytes:
    """One unfragmented, unmasked, uncompressed text frame (RFC 6455, 5.2) holding `data`."""
    n = len(data)
    if n <= 125:
        return bytes((_FIN_TEXT, n)) + data
    if n <= 0xFFFF:
        return struct.pack("!BBH", _FIN_TEXT, 126, n) + data
    return struct.pack("!BBQ", _FIN_TEXT, 127, n) + data


def _header(frame: bytes) -> int:
    size = frame[1] & 0x7F
    return 2 if size < 126 else 4 if size == 126 else 10


def payload(frame: bytes) -> bytes:
    """The data of a frame made by `text_frame`."""
    return frame[_header(frame) :]


def payload_size(frame: bytes) -> int:
    """The length of that data, without copying it."""
    return len(frame) - _header(frame)
