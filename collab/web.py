"""The web process: Daphne on uvloop.

`python -m collab.web -b HOST -p PORT collab.asgi:application` takes Daphne's own
command line (`python -m daphne --help`). Daphne makes its Twisted reactor's asyncio
loop with `asyncio.new_event_loop()` when `daphne.server` is first imported, so the
loop policy set here, before that import, decides which loop it is; Twisted's
`AsyncioSelectorReactor` runs on uvloop's, which spends less CPU per delivered frame
than the standard loop (docs/benchmarks/2026-12-03.md#b-faster-parts). `python -m
daphne` still works, on the standard loop.

It also makes Twisted write each frame to its socket at once when nothing is queued
for that socket (`EagerServer`): Twisted queues every write and registers the socket
for writability, then writes and unregisters it on the next loop turn, two epoll
calls and a reactor callback per frame per member
(docs/benchmarks/2026-12-03.md#b-writing-at-once).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from twisted.internet.tcp import Server


def use_uvloop() -> bool:
    """Make uvloop the loop of every loop created from here on; False where it is not
    installed (it does not build on Windows): the standard loop then, as before."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def eager_server() -> type[Server]:
    """Twisted's TCP server connection, writing at once when its queue is empty.

    What the socket does not take now (a slow reader's full buffer) is queued as
    before, and every later write queues behind it until it drains: the bytes keep
    their order, and Twisted's flow control and close handling stay as they were.
    """
    from twisted.internet import tcp

    class EagerServer(tcp.Server):
        def write(self, data: Any) -> None:
            if (
                type(data) is bytes
                and data
                and self.connected
                and not (self.disconnecting or self._writeDisconnected or self._aborting or self.TLS)
                and (self.producer is None or self.streamingProducer)  # a pull producer resumes from doWrite
                and not self._tempDataLen
                and self.offset == len(self.dataBuffer)
            ):
                sent = self.writeSomeData(data)
                if isinstance(sent, int):  # else the connection is lost: the queued write finds it out
                    if sent == len(data):
                        return
                    data = data[sent:]
            super().write(data)

    return EagerServer


def write_eagerly() -> None:
    """Every TCP port opened from here on hands its connections to `eager_server()`."""
    from twisted.internet import tcp

    tcp.Port.transport = eager_server()


def close_with_reason() -> None:
    """Send the ASGI `websocket.close` message's `reason` in the close frame: Daphne
    (4.2) drops it, and a 4429's reason is its retry hint (docs/wire.md, 4429)."""
    from daphne.ws_protocol import WebSocketProtocol

    reply = WebSocketProtocol.handle_reply

    def handle_reply(self: WebSocketProtocol, message: dict[str, Any]) -> None:
        if message.get("type") == "websocket.close" and message.get("reason") and self.state != self.STATE_CONNECTING:
            self.sendClose(code=message.get("code") or 1000, reason=str(message["reason"]))
            return
        reply(self, message)

    WebSocketProtocol.handle_reply = handle_reply  # type: ignore[method-assign]


def main() -> None:
    use_uvloop()
    from daphne.cli import CommandLineInterface  # imports daphne.server: after the policy

    write_eagerly()  # after daphne.server installed its reactor
    close_with_reason()
    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
