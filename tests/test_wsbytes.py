"""A room frame's WebSocket bytes, built once (collab/chat/wsbytes.py), are the very bytes
Daphne's own protocol (autobahn) writes for that text, and a socket's outbox writes them
as they are only where that holds."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from daphne.ws_protocol import WebSocketFactory
from twisted.internet.testing import StringTransport

from collab.chat import wsbytes
from collab.chat.outbox import Outbox

# Every length encoding of RFC 6455 and both sides of each boundary.
SIZES = [0, 1, 125, 126, 127, 65535, 65536, 70000]


def daphne_socket() -> tuple[Any, StringTransport]:
    """Daphne's WebSocket protocol, made by its factory with the options Daphne's server
    sets (daphne/server.py), on a transport that records what is written, open."""
    factory = WebSocketFactory(object, server="collab-test")
    factory.setProtocolOptions(autoPingTimeout=20, allowNullOrigin=True, openHandshakeTimeout=5,
                               maxMessagePayloadSize=1024 * 1024, maxFramePayloadSize=1024 * 1024)  # fmt: skip
    protocol = factory.buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.state = protocol.STATE_OPEN  # the handshake, done
    transport.clear()
    return protocol, transport


def text(size: int) -> bytes:
    return ("é" * (size // 2) + "x" * (size % 2)).encode()


@pytest.mark.parametrize("size", SIZES)
def test_a_frame_is_what_daphne_writes_for_the_text(size: int) -> None:
    data = text(size)
    assert len(data) == size
    protocol, transport = daphne_socket()
    protocol.sendMessage(data, False)
    assert wsbytes.text_frame(data) == transport.value()
    assert wsbytes.payload(wsbytes.text_frame(data)) == data
    assert wsbytes.payload_size(wsbytes.text_frame(data)) == size


def opened_outbox() -> tuple[Outbox, Any, StringTransport]:
    protocol, transport = daphne_socket()

    async def send(_html: str) -> None:  # the consumer's own send: not reached on these paths
        raise AssertionError("offer writes through the protocol")

    async def overflow() -> None:
        raise AssertionError("nothing overflows here")

    outbox = Outbox(send, overflow)
    assert watch(outbox, protocol)
    return outbox, protocol, transport


def watch(outbox: Outbox, protocol: Any) -> bool:
    """What the consumer does at connect: Daphne hands it `partial(server.handle_reply, protocol)`."""
    return outbox.watch(functools.partial(lambda _protocol, _message: None, protocol))


@pytest.mark.parametrize("size", [10, 200, 70000])
def test_the_outbox_writes_the_rooms_bytes_as_they_are(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    outbox, protocol, transport = opened_outbox()
    frame = wsbytes.text_frame(text(size))
    monkeypatch.setattr(protocol, "sendMessage", None)  # not called: the bytes go straight to the transport
    assert outbox.offer("unused", frame)
    assert transport.value() == frame


def test_a_socket_that_compresses_is_sent_the_text_the_usual_way() -> None:
    outbox, protocol, transport = opened_outbox()
    sent: list[bytes] = []
    protocol._perMessageCompress = object()  # negotiated permessage-deflate: its own bytes per socket
    protocol.sendMessage = lambda data, _binary: sent.append(data)
    assert outbox.offer("unused", wsbytes.text_frame(b"<p>hi</p>"))
    assert sent == [b"<p>hi</p>"] and transport.value() == b""


def test_a_frame_past_the_size_limit_is_left_to_autobahn() -> None:
    outbox, protocol, transport = opened_outbox()
    protocol.maxMessagePayloadSize = 100
    watch(outbox, protocol)  # the limit is read here
    assert outbox.offer("unused", wsbytes.text_frame(text(100)))  # at the limit: the bytes as built
    assert transport.value() == wsbytes.text_frame(text(100))
    with pytest.raises(Exception, match="exceeding payload limit"):
        outbox.offer("unused", wsbytes.text_frame(text(101)))


@pytest.mark.parametrize("option", ["maskServerFrames", "autoFragmentSize", "logFrames"])
def test_a_socket_whose_frames_autobahn_would_build_otherwise_is_sent_the_text(option: str) -> None:
    """Masked, fragmented or logged frames: autobahn's own, decided when the socket is watched."""
    outbox, protocol, transport = opened_outbox()
    setattr(protocol, option, 4 if option == "autoFragmentSize" else True)
    watch(outbox, protocol)
    sent: list[bytes] = []
    protocol.sendMessage = lambda data, _binary: sent.append(data)
    assert outbox.offer("unused", wsbytes.text_frame(b"<p>hi</p>"))
    assert sent == [b"<p>hi</p>"] and transport.value() == b""


def test_autobahns_queue_is_not_overtaken() -> None:
    outbox, protocol, transport = opened_outbox()
    protocol.send_queue.append((b"queued", False))  # autobahn is trickling a write out (sync or chopped)
    queued: list[bytes] = []
    protocol.sendMessage = lambda data, _binary: queued.append(data)
    assert outbox.offer("unused", wsbytes.text_frame(b"next"))
    assert queued == [b"next"] and transport.value() == b""  # behind it, through autobahn's queue
