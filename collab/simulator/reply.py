"""Writing one completion's reply: the SSE stream, or the whole JSON answer.

:class:`ReplyWriter` is the part of :class:`collab.simulator.app.SimulatorApp` that
sends a completion once the app has routed and parsed it and picked its fault: token
by token on the schedule (``"stream": true``; the timing contract is in
:mod:`collab.simulator.app`), or in one body when its last token is due. It also cuts
a response short on purpose (the ``drop`` fault, and shutdown), with the log filter
that keeps uvicorn quiet about exactly those cuts. :class:`Stats` are the app's
counters.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import itertools
import json
import logging
import time
import uuid
from collections.abc import Iterable
from typing import Any

from .config import FaultKind, SimConfig
from .request import Completion as _Completion
from .request import Send
from .request import dumps as _dumps
from .text import count_prompt_tokens, iter_tokens, simulated_tokens, thinking_tokens
from .timing import Schedule

__all__ = ["ReplyWriter", "Stats", "install_log_filter"]

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


class ReplyWriter:
    """Sends a completion's reply (a base of :class:`collab.simulator.app.SimulatorApp`)."""

    config: SimConfig
    stats: Stats
    _shutting_down: bool

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
            pieces = iter_tokens(
                req.messages, self.config.seed, req.model, req.reply_tokens or self.config.reply_tokens
            )
            if req.proof:  # first the line that proves what it held of files (files.py)
                pieces = itertools.chain(req.proof, pieces)
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
            tokens = simulated_tokens(
                req.messages, self.config.seed, req.model, req.reply_tokens or self.config.reply_tokens
            )
            tokens = [*(req.proof or ()), *tokens]
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
