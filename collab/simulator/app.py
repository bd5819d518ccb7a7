"""The simulated model as a plain ASGI application (no framework).

Routes: ``POST /v1/chat/completions`` (streaming and not), ``GET /v1/models``
and ``GET /v1/models/{id}``. Errors are OpenAI-shaped:
``{"error": {"message", "type", "param", "code"}}``.

Timing contract, from the moment the request reaches the app (its wall-clock
time is the ``x-sim-start`` response header): content token ``i`` (from 0) is
written at ``start + ttft + i / tps`` (see :mod:`.timing`; with ``tick_ms``
at the next tick of the stream). Due times are computed from the start, never
accumulated, and each wake-up writes every token that is due (each as its own
SSE event) in one transport write, so the schedule does not drift even when
the event loop wakes late.

The reply itself, streamed or whole, is written by :class:`.reply.ReplyWriter`
(this app's base class, in :mod:`collab.simulator.reply`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
import uuid
from typing import Any

from . import files
from .config import SLOW_FACTOR, FaultKind, ModelSpec, SimConfig, parse_model
from .directives import HOLD_TOKENS, HOLD_TPS, shape_of
from .reply import ReplyWriter, Stats, install_log_filter
from .request import Completion as _Completion
from .request import HTTPError as _HTTPError
from .request import Receive, Scope, Send, check_auth, fault_error, parse_completion, read_body
from .request import dumps as _dumps
from .text import split_tokens
from .timing import Schedule
from .tools import script_for

__all__ = ["SimulatorApp", "install_log_filter", "make_app"]


class SimulatorApp(ReplyWriter):
    """ASGI app serving an OpenAI-compatible simulated model."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.stats = Stats()
        # With `record` (testing.running_simulator_app sets it), every completion request,
        # parsed (model, messages), in order: what tests check was sent. Off for a server
        # that runs long (benchmarks, load tests): it would only grow.
        self.record = False
        self.recorded: list[dict[str, Any]] = []
        self._fault_rng = random.Random(f"collab-simulator-faults:{self.config.seed}")
        self._stops: set[asyncio.Event] = set()
        self._shutting_down = False
        self._auth = f"Bearer {self.config.api_key}".encode() if self.config.api_key is not None else None
        install_log_filter()

    @property
    def active_requests(self) -> int:
        """Completion requests currently being served (streaming, waiting or stalled)."""
        return len(self._stops)

    def begin_shutdown(self) -> None:
        """End every in-flight completion promptly (call from the server's event loop)."""
        self._shutting_down = True
        for stop in list(self._stops):
            stop.set()

    # ---------------------------------------------------------------- ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.begin_shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        start_wall = time.time()
        start_mono = asyncio.get_running_loop().time()
        self.stats.requests += 1
        try:
            method: str = scope["method"]
            path: str = scope["path"]
            if path == "/v1/chat/completions":
                if method != "POST":
                    raise _HTTPError(405, f"Method {method} not allowed for {path}", headers=[(b"allow", b"POST")])
                check_auth(scope, self._auth)
                body = await read_body(scope, receive, self.config.max_body_bytes)
                if body is None:
                    return  # client left before sending the body
                request = self._parse_completion(body)
                try:  # its images and documents (files.py): a malformed image part is a 400
                    held = files.proof(request.messages)
                except ValueError as exc:
                    raise _HTTPError(400, str(exc), param="messages") from None
                request.proof = split_tokens(held + "\n\n") if held else None
                if self.record:  # an image as its type, size and pixels: never its bytes, kept for good
                    messages, images = files.for_record(request.messages) if held else (request.messages, [])
                    seen: dict[str, Any] = {"model": request.model, "messages": messages}
                    if images:
                        seen["images"] = images
                    self.recorded.append(seen if request.tools is None else {**seen, "tools": request.tools})
                await self._completion(request, receive, send, start_wall, start_mono)
            elif path == "/v1/models" or path.startswith("/v1/models/"):
                if method not in ("GET", "HEAD"):
                    raise _HTTPError(405, f"Method {method} not allowed for {path}", headers=[(b"allow", b"GET")])
                check_auth(scope, self._auth)
                await self._models(path, send)
            else:
                raise _HTTPError(404, f"Invalid URL ({method} {path})")
        except _HTTPError as err:
            await self._send_json(send, err.status, err.body, err.headers)

    # ------------------------------------------------------------- helpers

    def _parse_completion(self, body: bytes) -> _Completion:
        return parse_completion(body)

    def _pick_fault(self, spec: ModelSpec) -> tuple[FaultKind, int]:
        if spec.fault != "none":
            return spec.fault, self.config.fault_after if spec.fault_after is None else spec.fault_after
        fault = self.config.fault
        if fault != "none" and (self.config.fault_rate >= 1.0 or self._fault_rng.random() < self.config.fault_rate):
            return fault, self.config.fault_after
        return "none", 0

    async def _models(self, path: str, send: Send) -> None:
        def card(name: str) -> dict[str, Any]:
            return {"id": name, "object": "model", "created": 0, "owned_by": "collab-simulator"}

        if path == "/v1/models":
            body = _dumps({"object": "list", "data": [card(m) for m in self.config.models]})
        else:
            name = path[len("/v1/models/") :]
            try:
                parse_model(name)
            except ValueError:
                raise _HTTPError(404, f"The model '{name}' does not exist", code="model_not_found") from None
            body = _dumps(card(name))
        await self._send_json(send, 200, body)

    # ---------------------------------------------------------- completions

    async def _completion(
        self, req: _Completion, receive: Receive, send: Send, start_wall: float, start_mono: float
    ) -> None:
        try:  # {{hold}}, {{fault SPEC}} in its last user message (directives.py)
            shape = shape_of(req.messages)
        except ValueError as exc:
            raise _HTTPError(400, str(exc), param="messages") from None
        fault, fault_after = self._pick_fault(shape.fault or req.spec)
        refusal = fault_error(fault)  # 429, quota, 500: an error status instead of a reply
        if refusal is not None:
            raise refusal

        config = self.config
        self.stats.completions += 1
        # A scripted reply (tool calls, a verdict: tools.py) instead of the text, if any.
        offered = None if req.tool_choice == "none" else req.tools  # "none": text, as the API says
        script = req.script = script_for(req.messages, offered, config.seed, req.model)
        # n: completion tokens, the reasoning ones (think@N) first; max_tokens counts both.
        n = req.spec.think + (config.reply_tokens if script is None else len(script.pieces))
        if shape.hold and script is None:
            req.reply_tokens = HOLD_TOKENS
            n = req.spec.think + HOLD_TOKENS
        if script is not None:
            req.proof = None  # a scripted reply (tool calls, a verdict) is only that
        elif req.proof:  # the text starts with the line proving what the request held of files
            n += len(req.proof)
        finish_reason = "stop" if script is None else script.finish_reason
        if req.max_tokens is not None and req.max_tokens < n:
            n = req.max_tokens
            finish_reason = "length"
        tps = config.tps / SLOW_FACTOR if req.spec.slow else config.tps
        if shape.hold:
            tps = min(tps, HOLD_TPS)
        limit = min(fault_after, n) if fault in ("stall", "drop") else n
        headers = [
            (b"x-sim-start", f"{start_wall:.6f}".encode()),
            (b"x-sim-tps", f"{tps:g}".encode()),
            (b"x-sim-ttft-ms", f"{config.ttft_ms:g}".encode()),
            (b"x-sim-tick-ms", f"{config.tick_ms:g}".encode()),
            (b"x-sim-tokens", str(limit).encode()),
            (b"x-request-id", uuid.uuid4().hex.encode()),
        ]
        timing = Schedule(start_mono + config.ttft_ms / 1000.0, tps, config.tick_ms / 1000.0)

        stop = asyncio.Event()
        self._stops.add(stop)
        self.stats.peak_active = max(self.stats.peak_active, len(self._stops))
        if self._shutting_down:
            stop.set()
        watcher = asyncio.create_task(self._watch_disconnect(receive, stop))
        try:
            if req.stream:
                await self._stream(req, send, stop, n, finish_reason, headers, timing, fault, limit)
            else:
                await self._respond(req, send, stop, n, finish_reason, headers, timing, fault, limit)
        finally:
            self._stops.discard(stop)
            watcher.cancel()

    async def _watch_disconnect(self, receive: Receive, stop: asyncio.Event) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.stats.disconnects += 1
                stop.set()
                return


def make_app(config: SimConfig | None = None, **overrides: Any) -> SimulatorApp:
    """Build the ASGI app: ``make_app(SimConfig(tps=100))`` or ``make_app(tps=100)``."""
    return SimulatorApp(dataclasses.replace(config or SimConfig(), **overrides))
