"""collab.web's EagerServer: a frame goes to the socket at once when nothing is queued;
what a slow reader's socket does not take is queued, and later writes keep their order."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest
from twisted.internet.protocol import Protocol

from collab.web import eager_server


class Reactor:
    """The part of a reactor a connection calls: which descriptors await writability."""

    def __init__(self) -> None:
        self.writers: set[object] = set()
        self.added = 0

    def addWriter(self, writer: object) -> None:  # Twisted's names
        self.added += 1
        self.writers.add(writer)

    def removeWriter(self, writer: object) -> None:
        self.writers.discard(writer)

    def addReader(self, reader: object) -> None:
        pass

    def removeReader(self, reader: object) -> None:
        pass


@pytest.fixture
def pair() -> Iterator[tuple[object, socket.socket, Reactor]]:
    """A real TCP connection: the server's end in an EagerServer, the peer's end raw."""
    listener = socket.create_server(("127.0.0.1", 0))
    peer = socket.create_connection(listener.getsockname())
    accepted, address = listener.accept()
    listener.close()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    accepted.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    reactor = Reactor()
    server = eager_server()(accepted, Protocol(), address, None, 0, reactor)  # type: ignore[arg-type]
    server.connected = 1
    yield server, peer, reactor
    peer.close()
    accepted.close()


def _read(peer: socket.socket, size: int) -> bytes:
    peer.settimeout(5)
    out = b""
    while len(out) < size:
        out += peer.recv(size - len(out))
    return out


def test_a_frame_is_written_at_once_without_waiting_for_writability(pair) -> None:
    server, peer, reactor = pair
    server.write(b"frame one")
    server.write(b"frame two")
    assert _read(peer, 18) == b"frame oneframe two"
    assert reactor.added == 0 and not reactor.writers


def test_what_a_slow_reader_does_not_take_is_queued_and_later_writes_keep_their_order(pair) -> None:
    server, peer, reactor = pair
    blob = bytes(range(256)) * 4096  # 1 MiB: more than the two socket buffers hold
    server.write(blob)
    assert reactor.writers == {server}  # the rest waits for writability
    server.write(b"tail")  # queued behind the rest, never ahead of it
    peer.setblocking(False)
    received = bytearray()
    while reactor.writers:
        with contextlib.suppress(BlockingIOError):
            received += peer.recv(1 << 20)
        assert server.doWrite() is None
    received += _read(peer, len(blob) + 4 - len(received))
    assert bytes(received) == blob + b"tail"
    added = reactor.added
    server.write(b"after")  # drained: at once again
    assert _read(peer, 5) == b"after" and reactor.added == added


def test_a_write_to_a_lost_connection_is_queued_for_twisted_to_find_the_loss(pair) -> None:
    server, peer, reactor = pair
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    peer.close()  # a reset, not a clean close
    for _ in range(50):  # the reset arrives; the first send after it fails
        server.write(b"x" * 1024)
        if reactor.writers:
            break
    assert reactor.writers == {server}
    assert server.doWrite() is not None  # Twisted's own write reports the lost connection


def test_after_lose_connection_writes_are_queued_as_twisted_does(pair) -> None:
    server, _peer, reactor = pair
    server.disconnecting = 1
    server.write(b"late")
    assert reactor.writers == {server} and server._tempDataLen == 4


def test_after_abort_connection_nothing_is_written_at_once(pair) -> None:
    server, _peer, _reactor = pair
    server._aborting = True
    server.write(b"late")
    assert server._tempDataLen == 4  # queued: Twisted's aborted doWrite never sends it


def test_a_pull_producer_is_still_resumed_from_do_write(pair) -> None:
    server, peer, reactor = pair

    class Pull:
        resumed = 0

        def resumeProducing(self) -> None:
            self.resumed += 1

        def stopProducing(self) -> None:
            pass

    producer = Pull()
    server.registerProducer(producer, False)  # registering one asks it for data once
    resumed = producer.resumed
    server.write(b"chunk")
    assert reactor.writers == {server}
    assert server.doWrite() is None
    assert _read(peer, 5) == b"chunk" and producer.resumed == resumed + 1
