"""Streaming replies: one asyncio task per reply, all in parallel, owned by a process-wide
registry (not by any socket), each feeding a Coalescer that turns tokens into frames.

    llm.pool.stream_reply ──tokens──> Coalescer.push ──frames──> broadcast (one group_send per frame)

The reader never waits for the channel layer: pieces are appended in memory and a
separate flusher sends at most one frame per window (the first piece at once).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from channels.layers import get_channel_layer
from django.conf import settings

from collab.chat import metrics, rendering
from collab.chat.events import RoomFrame, room_group
from collab.llm import LLMError, Usage
from collab.llm.client import ChatMessage
from collab.llm.pool import ProviderConfig, stream_reply

log = logging.getLogger(__name__)

Emit = Callable[[int, str], Awaitable[None]]


class Coalescer:
    """Batches pushed text into pieces: the first piece goes at once, then at most one
    per `window_s`; an idle stream's next piece goes at once again.

    `emit(offset, text)` is awaited for each piece, one at a time, in order; the pieces
    are contiguous (each offset is the sum of the lengths before it).
    """

    def __init__(self, window_s: float, emit: Emit) -> None:
        self.window_s = window_s
        self.flushed = 0  # characters already handed to emit
        self._emit = emit
        self._pending: list[str] = []
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def push(self, text: str) -> None:
        self._pending.append(text)
        self._wake.set()

    async def close(self) -> None:
        """Flush what is pending now (no window wait) and stop."""
        self._closing.set()
        self._wake.set()
        await self._task

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._pending:
                # Window 0 is "no coalescing" (the load test's naive baseline): a frame per token.
                texts = ["".join(self._pending)] if self.window_s > 0 else list(self._pending)
                self._pending.clear()
                for text in texts:
                    offset = self.flushed
                    self.flushed += len(text)
                    await self._emit(offset, text)
            if self._closing.is_set():
                if not self._pending:
                    return
                continue
            if self.window_s <= 0:
                continue
            # Hold the next piece back for the rest of the window; close() cuts it short.
            try:
                async with asyncio.timeout(self.window_s):
                    await self._closing.wait()
            except TimeoutError:
                pass


@dataclass
class ReplyJob:
    """Everything a reply needs, read from the database before it starts."""

    message_id: int
    room_id: int
    provider: ProviderConfig
    model: str
    messages: list[ChatMessage]
    temperature: float | None
    max_tokens: int | None


@dataclass
class Outcome:
    text: str
    status: str  # done | stopped | failed
    error: str = ""
    ttft_ms: float | None = None
    tokens: int = 0
    prompt_tokens: int | None = None
    duration_ms: float = 0.0
    tps: float | None = None


@dataclass
class LiveReply:
    """A reply streaming in this process: what members that connect now are shown."""

    job: ReplyJob
    flushed_parts: list[str] = field(default_factory=list)  # every piece sent; all text once closed
    stop_reason: str = ""
    # Set once the reply's article has been broadcast: its first piece must not overtake
    # it. The model request starts before that, so the broadcast overlaps its first token.
    announced: asyncio.Event = field(default_factory=asyncio.Event)
    queued: bool = False  # waiting for a slot under the provider's concurrency cap
    task: asyncio.Task[None] | None = None

    def flushed_text(self) -> str:
        """The text every member has been sent so far (pieces that follow start here)."""
        return "".join(self.flushed_parts)


Finish = Callable[[ReplyJob, Outcome], Awaitable[None]]


async def broadcast(room_id: int, frame: RoomFrame) -> None:
    """Send one pre-rendered frame to every socket of a room: the only group_send of a room."""
    metrics.FRAMES.labels(frame["kind"]).inc()
    layer = get_channel_layer()
    assert layer is not None
    await layer.group_send(room_group(room_id), frame)  # type: ignore[arg-type]


async def _send_state(live: LiveReply, text: str) -> None:
    message_id = live.job.message_id
    html = rendering.frame_state(message_id, text)
    await broadcast(live.job.room_id, {"type": "room.frame", "kind": "other", "msg": message_id, "html": html})


async def _send_delta(live: LiveReply, offset: int, text: str) -> None:
    if not live.announced.is_set():
        await live.announced.wait()
    live.flushed_parts.append(text)
    message_id = live.job.message_id
    html = rendering.frame_delta(message_id, offset, text)
    await broadcast(
        live.job.room_id, {"type": "room.frame", "kind": "delta", "msg": message_id, "offset": offset, "html": html}
    )


async def run_reply(live: LiveReply, finish: Finish) -> None:
    """Stream one reply to its room, then hand the outcome to `finish` (store + broadcast)."""
    job = live.job

    async def emit(offset: int, text: str) -> None:
        await _send_delta(live, offset, text)

    coalescer = Coalescer(settings.COLLAB["COALESCE_MS"] / 1000, emit)
    loop = asyncio.get_running_loop()
    started = loop.time()
    first_at: float | None = None
    chunks = 0
    usage: Usage | None = None
    status, error = "done", ""
    shutting_down: asyncio.CancelledError | None = None

    async def on_queued(position: int) -> None:
        live.queued = True
        await _send_state(live, f"queued ({position} ahead)" if position > 1 else "queued")

    async def on_started(_base_url: str) -> None:
        nonlocal started
        started = loop.time()  # time to first token is the model's, not the queue's
        if live.queued:
            live.queued = False
            await _send_state(live, "writing…")

    try:
        async with (
            asyncio.timeout(job.provider.total_timeout_s),
            aclosing(
                stream_reply(
                    job.provider,
                    job.model,
                    job.messages,
                    temperature=job.temperature,
                    max_tokens=job.max_tokens,
                    on_queued=on_queued,
                    on_started=on_started,
                )
            ) as stream,
        ):
            async for item in stream:
                if isinstance(item, Usage):
                    usage = item
                    continue
                if first_at is None:
                    first_at = loop.time()
                chunks += 1
                coalescer.push(item)
    except LLMError as exc:
        status, error = "failed", exc.message
        log.warning("reply %s failed: %s", job.message_id, exc)
    except TimeoutError:
        status, error = "failed", f"the reply took longer than {job.provider.total_timeout_s:g} s"
    except asyncio.CancelledError as exc:
        # stop() sets a reason first; any other cancellation is the process shutting
        # down: the reply is stored as failed, then the cancellation goes on.
        if live.stop_reason:
            status = "stopped"
        else:
            status, error, shutting_down = "failed", "the server restarted mid-reply", exc
    except Exception:  # a bug must not leave the reply streaming forever
        log.exception("reply %s crashed", job.message_id)
        status, error = "failed", "internal error"

    await coalescer.close()
    ended = loop.time()
    tokens = usage.completion_tokens if usage and usage.completion_tokens is not None else chunks
    streaming_s = ended - first_at if first_at is not None else 0.0
    outcome = Outcome(
        text=live.flushed_text(),  # the coalescer is closed: every piece has been sent
        status=status,
        error=error,
        ttft_ms=(first_at - started) * 1000 if first_at is not None else None,
        tokens=tokens,
        prompt_tokens=usage.prompt_tokens if usage else None,
        duration_ms=(ended - started) * 1000,
        # Tokens after the first, over the time they took: the stream's own rate.
        tps=(tokens - 1) / streaming_s if tokens > 1 and streaming_s > 0 else None,
    )
    metrics.REPLIES.labels(status).inc()
    metrics.REPLY_TOKENS.inc(tokens)
    if outcome.ttft_ms is not None:
        metrics.REPLY_TTFT.observe(outcome.ttft_ms / 1000)
    try:
        await finish(job, outcome)
    except Exception:
        log.exception("could not store reply %s", job.message_id)
    if shutting_down is not None:
        raise shutting_down


class Registry:
    """The replies streaming in this process, by message id."""

    def __init__(self) -> None:
        self._live: dict[int, LiveReply] = {}

    def start(self, job: ReplyJob, finish: Finish) -> LiveReply:
        live = LiveReply(job)
        self._live[job.message_id] = live
        metrics.REPLIES_STREAMING.inc()
        task = asyncio.get_running_loop().create_task(run_reply(live, finish), name=f"reply-{job.message_id}")
        live.task = task
        task.add_done_callback(lambda _t: self._ended(job.message_id))
        return live

    def _ended(self, message_id: int) -> None:
        self._live.pop(message_id, None)
        metrics.REPLIES_STREAMING.dec()

    def get(self, message_id: int) -> LiveReply | None:
        return self._live.get(message_id)

    def stop(self, message_id: int, reason: str = "stopped") -> bool:
        live = self._live.get(message_id)
        if live is None or live.task is None or live.task.done():
            return False
        live.stop_reason = reason
        live.task.cancel()
        return True

    def __len__(self) -> int:
        return len(self._live)

    async def wait_idle(self) -> None:
        """Wait until no reply is streaming (tests and graceful shutdown); the caller
        bounds the wait with asyncio.timeout."""
        while self._live:
            await asyncio.wait([lr.task for lr in self._live.values() if lr.task is not None])
            await asyncio.sleep(0)  # let the done-callbacks unregister the finished ones


registry = Registry()
