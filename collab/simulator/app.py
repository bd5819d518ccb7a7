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
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import itertools
import json
import logging
import random
import time
import uuid
from collections.abc import Iterable
from typing import Any

from .config import SLOW_FACTOR, FaultKind, ModelSpec, SimConfig, parse_model
from .request import Completion as _Completion
from .request import HTTPError as _HTTPError
from .request import Receive, Scope, Send, check_auth, fault_error, parse_completion, read_body
from .request import dumps as _dumps
from .text import count_prompt_tokens, iter_tokens, simulated_tokens, thinking_tokens
from .timing import Schedule
from .tools import script_for

__all__ = ["SimulatorApp", "install_log_filter", "make_app"]


_JSON_HEADERS: list[tuple[bytes, bytes]] = [(b"content-type", b"application/json")]
_SSE_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
_DONE = b"data: [DONE]\n\n"
_THINK = "\x00"  # marks a reasoning token in the stream's token iterator (never in the text)
_RAW = "\x01"  # marks a whole delta object (a scripted tool call's fragment), ditto

# Set by a request that cuts its own response on purpose: uvicorn then logs
# "ASGI callable returned without completing response." — the filter below
# drops exactly that record for exactly that request (same task context).
_INTENTIONAL_DROP: contextvars.ContextVar[bool] = contextvars.ContextVar("sim_intentional_drop", default=False)
_INCOMPLETE_MSG = "ASGI callable returned without completing response."


class _IntentionalDropFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == _INCOMPLETE_MSG and _INTENTIONAL_DROP.get())


_DROP_FILTER = _IntentionalDropFilter()


def install_log_filter() -> None:
    """Silence uvicorn's error line for the simulator's deliberate mid-stream drops."""
    logger = logging.getLogger("uvicorn.error")
    if _DROP_FILTER not in logger.filters:
        logger.addFilter(_DROP_FILTER)


_JSON_STR_CACHE: dict[str, str] = {}


def _json_str(token: str) -> str:
    """``json.dumps(token)``, memoised: replies reuse a small vocabulary."""
    encoded = _JSON_STR_CACHE.get(token)
    if encoded is None:
        encoded = json.dumps(token, ensure_ascii=False)
        if len(_JSON_STR_CACHE) < 50_000:
            _JSON_STR_CACHE[token] = encoded
    return encoded


@dataclasses.dataclass
class Stats:
    """Counters, mostly for tests and the benchmark."""

    requests: int = 0
    completions: int = 0
    content_chunks: int = 0
    writes: int = 0
    disconnects: int = 0
    drops: int = 0
    peak_active: int = 0  # the most completions served at once (reset it to measure a span)


class SimulatorApp:
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
                if self.record:
                    seen = {"model": request.model, "messages": request.messages}
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

    @staticmethod
    async def _send_json(send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*_JSON_HEADERS, (b"content-length", str(len(body)).encode()), *headers],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})

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
        fault, fault_after = self._pick_fault(req.spec)
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
        finish_reason = "stop" if script is None else script.finish_reason
        if req.max_tokens is not None and req.max_tokens < n:
            n = req.max_tokens
            finish_reason = "length"
        tps = config.tps / SLOW_FACTOR if req.spec.slow else config.tps
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

    def _cut_connection(self) -> None:
        """Return from the app next without finishing the body: the server closes the socket."""
        _INTENTIONAL_DROP.set(True)
        self.stats.drops += 1

    async def _stream(
        self,
        req: _Completion,
        send: Send,
        stop: asyncio.Event,
        n: int,
        finish_reason: str,
        headers: list[tuple[bytes, bytes]],
        timing: Schedule,
        fault: FaultKind,
        limit: int,
    ) -> None:
        created = int(time.time())
        usage_field = ',"usage":null' if req.include_usage else ""
        ident = (
            '{"id":"chatcmpl-'
            + uuid.uuid4().hex[:24]
            + '","object":"chat.completion.chunk","created":'
            + str(created)
            + ',"model":'
            + json.dumps(req.model, ensure_ascii=False)
            + ',"system_fingerprint":"fp_sim"'
        )
        head = ident + ',"choices":[{"index":0,"delta":'
        tail = "}]" + usage_field + "}\n\n"
        before = "data: " + head
        # Pre-encode every event: the hot loop only slices and joins bytes.
        role = (
            before + '{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null' + tail
        ).encode()
        content_before = before + '{"content":'
        content_after = '},"logprobs":null,"finish_reason":null' + tail
        # Tokens are generated as they fall due (a long reply costs nothing upfront);
        # the first n of the full reply's pieces are exactly simulated_tokens(..., n).
        script = req.script
        if script is None:
            pieces = iter_tokens(req.messages, self.config.seed, req.model, self.config.reply_tokens)
        elif script.calls:  # each piece a whole delta object (tool-call fragments)
            pieces = iter([_RAW + delta for delta in script.pieces])
        else:
            pieces = iter(script.pieces)
        custom = bool(req.spec.think or (script is not None and script.calls))  # not only plain content
        if req.spec.think:  # reasoning first, in its own field: then the answer
            think_before = before + '{"' + req.spec.think_field + '":'
            pieces = itertools.chain(
                (_THINK + t for t in thinking_tokens(req.messages, self.config.seed, req.model, req.spec.think)),
                pieces,
            )

        def event(token: str) -> str:
            if token[:1] == _THINK:
                return think_before + _json_str(token[1:]) + content_after
            if token[:1] == _RAW:
                return before + token[1:] + content_after[1:]
            return content_before + _json_str(token) + content_after

        ending = (before + '{},"logprobs":null,"finish_reason":"' + finish_reason + '"' + tail).encode()
        if req.include_usage:
            prompt_tokens = count_prompt_tokens(req.messages)
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": n,
                "total_tokens": prompt_tokens + n,
            }
            ending += ("data: " + ident + ',"choices":[],"usage":').encode() + _dumps(usage) + b"}\n\n"
        ending += _DONE
        completes = fault == "none"

        await send({"type": "http.response.start", "status": 200, "headers": [*_SSE_HEADERS, *headers]})
        if not await timing.wait_until(timing.first, stop):
            return self._stopped(stop)
        sent = 0
        pending = role
        loop = asyncio.get_running_loop()
        stats = self.stats
        while True:
            now = loop.time()
            due = timing.due(now, limit)
            if due > sent:
                if custom:
                    body = "".join([event(next(pieces)) for _ in range(due - sent)]).encode()
                elif due - sent == 1:
                    body = (content_before + _json_str(next(pieces)) + content_after).encode()
                else:
                    body = "".join(
                        [content_before + _json_str(next(pieces)) + content_after for _ in range(due - sent)]
                    ).encode()
                if pending:
                    body = pending + body
                    pending = b""
                stats.content_chunks += due - sent
                stats.writes += 1
                sent = due
                if sent == limit and completes:
                    await send({"type": "http.response.body", "body": body + ending, "more_body": False})
                    return None
                await send({"type": "http.response.body", "body": body, "more_body": True})
            elif pending and sent >= limit:  # stall@0 / drop@0: just the role event
                await send({"type": "http.response.body", "body": pending, "more_body": True})
                pending = b""
            if sent >= limit:
                break
            if stop.is_set():
                return self._stopped(stop)
            if not await timing.wait_until(timing.write_time(sent), stop):
                return self._stopped(stop)
        if stop.is_set():
            return self._stopped(stop)
        if fault == "stall":
            await stop.wait()
            return self._stopped(stop)
        self._cut_connection()  # fault == "drop"
        return None

    def _stopped(self, stop: asyncio.Event) -> None:
        """Leave after ``stop``: a gone client needs nothing; on shutdown, cut the stream."""
        if self._shutting_down:
            self._cut_connection()

    async def _respond(
        self,
        req: _Completion,
        send: Send,
        stop: asyncio.Event,
        n: int,
        finish_reason: str,
        headers: list[tuple[bytes, bytes]],
        timing: Schedule,
        fault: FaultKind,
        limit: int,
    ) -> None:
        # Answer when the last token would have been generated.
        if not await timing.wait_until(timing.write_time(max(limit - 1, 0)), stop):
            return self._stopped(stop)
        if fault == "stall":
            await stop.wait()
            return self._stopped(stop)
        thoughts = thinking_tokens(req.messages, self.config.seed, req.model, req.spec.think)[:n]
        script = req.script
        if script is None:
            tokens = simulated_tokens(req.messages, self.config.seed, req.model, self.config.reply_tokens)
        else:
            tokens = list(script.pieces)
        tokens = thoughts + tokens[: n - len(thoughts)]
        prompt_tokens = count_prompt_tokens(req.messages)
        message: dict[str, Any] = {"role": "assistant", "content": "".join(tokens[len(thoughts) :]), "refusal": None}
        if script is not None and script.calls:
            message["content"] = None
            message["tool_calls"] = script.tool_calls(len(tokens) - len(thoughts))
        if thoughts:
            message[req.spec.think_field] = "".join(thoughts)
        body = _dumps(
            {
                "id": "chatcmpl-" + uuid.uuid4().hex[:24],
                "object": "chat.completion",
                "created": int(time.time()),
                "model": req.model,
                "system_fingerprint": "fp_sim",
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": finish_reason,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": len(tokens),
                    "total_tokens": prompt_tokens + len(tokens),
                },
            }
        )
        self.stats.content_chunks += len(tokens)
        if fault == "drop":
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [*_JSON_HEADERS, (b"content-length", str(len(body)).encode()), *headers],
                }
            )
            await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
            self._cut_connection()
            return None
        await self._send_json(send, 200, body, headers)
        return None


def make_app(config: SimConfig | None = None, **overrides: Any) -> SimulatorApp:
    """Build the ASGI app: ``make_app(SimConfig(tps=100))`` or ``make_app(tps=100)``."""
    return SimulatorApp(dataclasses.replace(config or SimConfig(), **overrides))
