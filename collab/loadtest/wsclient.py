"""A small, fast WebSocket client (RFC 6455) over a plain socket.

Made for the load generator: it reads everything the kernel has in one ``recv`` and
cuts all the complete frames out of it, so a member that is behind catches up in one
wake-up instead of one per frame. Under gevent's monkey-patched ``socket`` it
cooperates with other greenlets; it also works with plain threads. No extensions
(no permessage-deflate), text and binary messages, ping/pong and close handled.

Hand-written rather than a library's framing because it is cheaper where it counts:
side by side, websockets' Sans-I/O protocol in its place cost the generator more CPU per
delivery than issue 32 allowed (docs/benchmarks/loadgen-client.md#b-loadgen-client).
"""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import struct
from collections.abc import Mapping
from urllib.parse import urlsplit

__all__ = ["ConnectionClosed", "HandshakeError", "WebSocket"]

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
_RECV = 262_144  # bytes per recv: a lagging member takes a whole backlog at once


class HandshakeError(Exception):
    """The server refused the upgrade (status and the first line of its answer)."""

    def __init__(self, status: int, line: str) -> None:
        super().__init__(f"WebSocket handshake refused: {line}")
        self.status = status


class ConnectionClosed(Exception):
    """The connection ended; ``code`` is the close code the server sent, if any."""

    def __init__(self, code: int | None, reason: str = "") -> None:
        super().__init__(f"WebSocket closed (code {code}) {reason}".strip())
        self.code = code
        self.reason = reason


def _mask(payload: bytes, key: bytes) -> bytes:
    n = len(payload)
    if not n:
        return payload
    repeated = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(repeated, "little")).to_bytes(n, "little")


class WebSocket:
    """One client connection. ``recv_messages()`` blocks until at least one message is in."""

    def __init__(self, sock: socket.socket, leftover: bytes = b"") -> None:
        self.sock = sock
        self._buf = bytearray(leftover)
        self._pos = 0
        self._fragments: list[bytes] = []
        self._fragment_op = OP_TEXT
        self.closed = False
        self.close_code: int | None = None
        self.close_reason = ""  # the close frame's reason (4429 carries ``retry=MS``)

    # --- opening ----------------------------------------------------------------------

    @classmethod
    def connect(cls, url: str, headers: Mapping[str, str] | None = None, timeout: float = 10.0) -> WebSocket:
        """Open ``ws://host:port/path`` with extra request headers (Cookie, Origin ...)."""
        parts = urlsplit(url)
        if parts.scheme != "ws":
            raise ValueError(f"only ws:// URLs are supported, not {url!r}")
        host = parts.hostname or "127.0.0.1"
        port = parts.port or 80
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            key = base64.b64encode(os.urandom(16)).decode()
            host_header = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
            lines = [
                f"GET {path} HTTP/1.1",
                f"Host: {host_header}",
                "Upgrade: websocket",
                "Connection: Upgrade",
                f"Sec-WebSocket-Key: {key}",
                "Sec-WebSocket-Version: 13",
            ]
            lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    raise HandshakeError(0, "connection closed during the handshake")
                data += chunk
                if len(data) > 65536:
                    raise HandshakeError(0, "handshake answer too long")
            head, _, rest = data.partition(b"\r\n\r\n")
            status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            fields = status_line.split(" ", 2)
            status = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
            if status != 101:
                raise HandshakeError(status, status_line)
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        return cls(sock, rest)

    # --- reading ------------------------------------------------------------------------

    def recv_messages(self) -> list[bytes]:
        """Every complete data message now available (at least one); raises ConnectionClosed."""
        while True:
            out = self._parse()
            if out:
                return out
            if self.closed:
                raise ConnectionClosed(self.close_code, self.close_reason)
            try:
                chunk = self.sock.recv(_RECV)
            except OSError as exc:
                self.closed = True
                raise ConnectionClosed(None, str(exc)) from None
            if not chunk:
                self.closed = True
                raise ConnectionClosed(self.close_code, self.close_reason or "connection lost")
            if self._pos and self._pos == len(self._buf):
                self._buf = bytearray(chunk)
                self._pos = 0
            else:
                if self._pos > 65536:
                    del self._buf[: self._pos]
                    self._pos = 0
                self._buf += chunk

    def _parse(self) -> list[bytes]:
        buf = self._buf
        pos = self._pos
        end = len(buf)
        out: list[bytes] = []
        while end - pos >= 2:
            b0 = buf[pos]
            b1 = buf[pos + 1]
            length = b1 & 0x7F
            head = 2
            if length == 126:
                if end - pos < 4:
                    break
                length = (buf[pos + 2] << 8) | buf[pos + 3]
                head = 4
            elif length == 127:
                if end - pos < 10:
                    break
                length = struct.unpack_from("!Q", buf, pos + 2)[0]
                head = 10
            masked = b1 & 0x80
            if masked:
                head += 4
            if end - pos < head + length:
                break
            start = pos + head
            payload = bytes(buf[start : start + length])
            if masked:  # servers must not mask, but be lenient
                payload = _mask(payload, bytes(buf[start - 4 : start]))
            pos = start + length
            opcode = b0 & 0x0F
            fin = b0 & 0x80
            if opcode in (OP_TEXT, OP_BINARY):
                if fin:
                    out.append(payload)
                else:
                    self._fragments = [payload]
                    self._fragment_op = opcode
            elif opcode == OP_CONT:
                self._fragments.append(payload)
                if fin:
                    out.append(b"".join(self._fragments))
                    self._fragments = []
            elif opcode == OP_PING:
                self._send_frame(OP_PONG, payload)
            elif opcode == OP_CLOSE:
                self.close_code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                self.close_reason = payload[2:].decode("utf-8", "replace")
                if not self.closed:
                    self.closed = True
                    with contextlib.suppress(OSError):
                        self._send_frame(OP_CLOSE, payload[:2])
                break
        self._pos = pos
        return out

    # --- writing ------------------------------------------------------------------------

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        if n < 126:
            header = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 65536:
            header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        key = os.urandom(4)
        self.sock.sendall(header + key + _mask(payload, key))

    def send_text(self, text: str) -> None:
        if self.closed:
            raise ConnectionClosed(self.close_code)
        self._send_frame(OP_TEXT, text.encode("utf-8"))

    def close(self, code: int = 1000) -> None:
        """Say goodbye (best effort) and close the socket."""
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self._send_frame(OP_CLOSE, struct.pack("!H", code))
        with contextlib.suppress(OSError):
            self.sock.close()
