"""Run a real simulator on a loopback port for the duration of a ``with`` block.

    with running_simulator(tps=500, ttft_ms=0, seed=7) as base_url:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x")
        ...

``base_url`` ends in ``/v1`` (what the openai SDK wants). Keyword arguments
are :class:`SimConfig` fields. The server runs in a background thread with its
own event loop, so it works from sync and async tests alike (the test's loop is
never blocked by it, and it is never blocked by the test's loop).
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import threading
import time
from collections.abc import Iterator
from typing import Any

from .app import SimulatorApp
from .config import SimConfig
from .server import base_url as _base_url
from .server import bind_socket, build_server

__all__ = ["running_simulator", "running_simulator_app"]

STARTUP_TIMEOUT_S = 20.0
SHUTDOWN_TIMEOUT_S = 20.0


def _answers(host: str, port: int) -> bool:
    conn = http.client.HTTPConnection(host, port, timeout=2.0)
    try:
        conn.request("GET", "/v1/models", headers={"authorization": "Bearer probe"})
        status = conn.getresponse().status
    except OSError:
        return False
    finally:
        conn.close()
    return status in (200, 401)


@contextlib.contextmanager
def running_simulator_app(
    config: SimConfig | None = None, host: str = "127.0.0.1", **overrides: Any
) -> Iterator[tuple[str, SimulatorApp]]:
    """Like :func:`running_simulator`, also yielding the app (for its ``stats``/``active_requests``)."""
    sim_config = dataclasses.replace(config or SimConfig(), **overrides)
    app = SimulatorApp(sim_config)
    app.record = True  # app.recorded: the requests it got, for the tests to read
    sock = bind_socket(host, 0)
    port: int = sock.getsockname()[1]
    server = build_server(app, host, port, log_config=None)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # surfaced to the caller below
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"simulator:{port}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        # Poll until the server both says it started and answers HTTP.
        while not (server.started and _answers(host, port)):
            if not thread.is_alive():
                raise RuntimeError(f"simulator failed to start: {failure[0] if failure else 'thread exited'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"simulator did not answer within {STARTUP_TIMEOUT_S:g}s")
            thread.join(0.005)  # waits on the thread; returns early if it dies
        yield _base_url(host, port), app
    finally:
        server.should_exit = True
        thread.join(SHUTDOWN_TIMEOUT_S)
        sock.close()
        if thread.is_alive():
            raise RuntimeError("simulator thread did not stop")
    if failure:
        raise RuntimeError("simulator crashed") from failure[0]


@contextlib.contextmanager
def running_simulator(config: SimConfig | None = None, host: str = "127.0.0.1", **overrides: Any) -> Iterator[str]:
    """Serve the simulator on a free loopback port; yields ``http://127.0.0.1:PORT/v1``."""
    with running_simulator_app(config, host, **overrides) as (url, _app):
        yield url
