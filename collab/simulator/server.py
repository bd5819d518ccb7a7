"""Serve the simulator with uvicorn, programmatically."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from .app import SimulatorApp, install_log_filter
from .config import SimConfig

__all__ = ["SimulatorServer", "bind_socket", "build_server", "serve"]

# Leftover connections (a stalled stream whose client never reads) may keep
# a graceful shutdown waiting; the app ends its own streams on shutdown, this
# is only the backstop.
GRACEFUL_SHUTDOWN_S = 3
# Load tests open many streams at once.
BACKLOG = 2048


class SimulatorServer(uvicorn.Server):
    """uvicorn server that ends in-flight streams on shutdown and exits quietly on signals."""

    def __init__(self, config: uvicorn.Config, app: SimulatorApp) -> None:
        super().__init__(config)
        self.sim_app = app

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # Like uvicorn's, minus re-raising the signal after shutdown: Ctrl-C and
        # SIGTERM both mean "stop cleanly and return".
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.sim_app.begin_shutdown()
        await super().shutdown(sockets=sockets)


def bind_socket(host: str = "127.0.0.1", port: int = 0, backlog: int = BACKLOG) -> socket.socket:
    """A bound, listening TCP socket for ``server.run(sockets=[...])`` (``port=0`` picks a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets whose
    # proto says TCP, and accepted sockets inherit it. With proto 0, Nagle's
    # algorithm holds small SSE writes for the client's delayed ACK (~40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)  # connections queue from now on, even before uvicorn starts
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def build_server(
    config: SimConfig | SimulatorApp,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    log_config: dict[str, Any] | None = LOGGING_CONFIG,
    log_level: str = "warning",
) -> SimulatorServer:
    """A ready-to-run uvicorn server for the simulator (``server.run(sockets=[...])``).

    Pass ``log_config=None`` to leave the process's logging configuration alone
    (tests do, so uvicorn's records just propagate to the root logger).
    """
    app = config if isinstance(config, SimulatorApp) else SimulatorApp(config)
    uv_config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        log_config=log_config,
        lifespan="off",
        ws="none",
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        backlog=BACKLOG,
    )
    install_log_filter()
    return SimulatorServer(uv_config, app)


def base_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/v1"


def serve(
    config: SimConfig,
    host: str = "127.0.0.1",
    port: int = 8001,
    announce: Callable[[str], None] | None = None,
) -> None:
    """Run until SIGINT/SIGTERM. Prints the one start line once the port is bound."""
    sock = bind_socket(host, port)
    try:
        bound_port: int = sock.getsockname()[1]
        server = build_server(config, host, bound_port)
        line = (
            f"simulated model on {base_url(host, bound_port)} "
            f"(tps={config.tps:g}, ttft={config.ttft_ms:g} ms, seed={config.seed})"
        )
        if announce is None:
            print(line, flush=True)
        else:
            announce(line)
        server.run(sockets=[sock])
    finally:
        sock.close()
