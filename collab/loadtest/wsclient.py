"""The load generator's WebSocket client: websockets' Sans-I/O protocol over a plain socket.

The framing, the handshake's checks, ping/pong and the closing handshake are the
library's (:class:`websockets.client.ClientProtocol`); this module only moves bytes. It
hands the protocol everything the kernel has in one ``recv`` and takes every complete
message out of it, so a member that is behind catches up in one wake-up instead of one
per frame. Under gevent's monkey-patched ``socket`` it cooperates with other greenlets;
it also works with plain threads.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Mapping
from typing import cast

from websockets.client import ClientProtocol
from websockets.exceptions import InvalidStatus
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

__all__ = ["ConnectionClosed", "HandshakeError", "WebSocket"]

_RECV = 262_144  # bytes per recv: a lagging member takes a whole backlog at once
_TEXT, _BINARY, _CONT, _CLOSE = Opcode.TEXT, Opcode.BINARY, Opcode.CONT, Opcode.CLOSE
_Frames = list[Frame]  # past the handshake the protocol's events are all frames (made once, not per read)


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


def _protocol(url: str, state: State) -> ClientProtocol:
    # No size limit: the server under test caps its own frames (1 MiB, WIRE.md), and a
    # frame over any limit here would end the member's run instead of being counted.
    return ClientProtocol(parse_uri(url), state=state, max_size=None)


class WebSocket:
    """One client connection. ``recv_messages()`` blocks until at least one message is in.

    ``protocol`` is an opened :class:`~websockets.client.ClientProtocol`; without one the
    socket is taken as already upgraded (a test's socket pair)."""

    def __init__(
        self, sock: socket.socket, protocol: ClientProtocol | None = None, pending: list[Frame] | None = None
    ) -> None:
        self.sock = sock
        self.protocol = protocol if protocol is not None else _protocol("ws://localhost/", State.OPEN)
        self._pending = pending or []  # frames that came in the handshake's last read
        self._fragments: list[bytes] = []
        self.closed = False
        self.close_code: int | None = None

    # --- opening ----------------------------------------------------------------------

    @classmethod
    def connect(cls, url: str, headers: Mapping[str, str] | None = None, timeout: float = 10.0) -> WebSocket:
        """Open ``ws://host:port/path`` with extra request headers (Cookie, Origin ...)."""
        uri = parse_uri(url)
        if uri.secure:
            raise ValueError(f"only ws:// URLs are supported, not {url!r}")
        protocol = _protocol(url, State.CONNECTING)
        request = protocol.connect()
        for name, value in (headers or {}).items():
            request.headers[name] = value
        protocol.send_request(request)
        sock = socket.create_connection((uri.host, uri.port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(b"".join(protocol.data_to_send()))
            while protocol.state is State.CONNECTING and protocol.handshake_exc is None:
                chunk = sock.recv(65536)
                if chunk:
                    protocol.receive_data(chunk)
                else:
                    protocol.receive_eof()
                    if protocol.state is State.CONNECTING and protocol.handshake_exc is None:
                        raise HandshakeError(0, "connection closed during the handshake")
            exc = protocol.handshake_exc
            if isinstance(exc, InvalidStatus):
                response = exc.response
                raise HandshakeError(response.status_code, f"HTTP {response.status_code} {response.reason_phrase}")
            if exc is not None:
                raise HandshakeError(0, str(exc))
            # The 101 response, and the first frames if they came in the same read.
            pending = [event for event in protocol.events_received() if isinstance(event, Frame)]
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        return cls(sock, protocol, pending)

    # --- reading ------------------------------------------------------------------------

    def recv_messages(self) -> list[bytes]:
        """Every complete data message now available (at least one); raises ConnectionClosed.

        The messages that came before a close frame are returned first; the next call
        raises."""
        protocol = self.protocol
        while True:
            events = cast(_Frames, protocol.events_received())
            if self._pending:
                events = self._pending + events
                self._pending = []
            if events:
                out = self._messages(events)
                if out:
                    return out
            if self.closed:
                raise ConnectionClosed(self.close_code)
            try:
                chunk = self.sock.recv(_RECV)
            except OSError as exc:
                self.closed = True
                raise ConnectionClosed(None, str(exc)) from None
            if not chunk:
                self.closed = True
                raise ConnectionClosed(self.close_code, "connection lost")
            protocol.receive_data(chunk)
            if protocol.parser_exc is not None:
                # A frame the protocol refused: it has queued its close frame and reads no
                # more. The messages before that frame are still returned.
                self.closed = True
                self._flush()

    def _messages(self, events: list[Frame]) -> list[bytes]:
        out: list[bytes] = []
        for frame in events:
            opcode = frame.opcode
            if opcode is _TEXT or opcode is _BINARY:
                # The protocol's buffer hands out bytearrays; a message is a dict key.
                data = bytes(frame.data)
                if frame.fin:
                    out.append(data)
                else:
                    self._fragments = [data]
            elif opcode is _CONT:
                self._fragments.append(bytes(frame.data))
                if frame.fin:
                    out.append(b"".join(self._fragments))
                    self._fragments = []
            else:  # a ping or a close: the protocol has queued the answer (pong, close echo)
                if opcode is _CLOSE:
                    close = self.protocol.close_rcvd
                    self.close_code = close.code if close is not None else 1005
                    self.closed = True
                self._flush()
        return out

    # --- writing ------------------------------------------------------------------------

    def _flush(self) -> None:
        # An empty chunk is the protocol asking for the end of the stream: the socket's
        # close does that.
        data = b"".join(self.protocol.data_to_send())
        if data:
            with contextlib.suppress(OSError):
                self.sock.sendall(data)

    def send_text(self, text: str) -> None:
        if self.closed or self.protocol.state is not State.OPEN:
            raise ConnectionClosed(self.close_code)
        self.protocol.send_text(text.encode("utf-8"))
        self.sock.sendall(b"".join(self.protocol.data_to_send()))

    def close(self, code: int = 1000) -> None:
        """Say goodbye (best effort) and close the socket."""
        if not self.closed:
            self.closed = True
            if self.protocol.state is State.OPEN:
                self.protocol.send_close(code)
                self._flush()
        with contextlib.suppress(OSError):
            self.sock.close()
