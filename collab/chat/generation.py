"""The streaming engine: one asyncio task per reply, all in parallel, owned by a
process-wide registry (not by any socket). It knows neither HTML nor the channel layer:
it hands pieces, states and the outcome to a `Sink` that its caller supplies.

    llm.pool.stream_reply ──tokens──> Coalescer ──pieces──> sink.piece(offset, text)
                         ──thoughts─> Coalescer ──pieces──> sink.thought(offset, text)   (offsets of their own)
                                                  outcome──> sink.finish(outcome)   (always, in `finally`)

The reader never waits for the sink: tokens are appended in memory and a separate
flusher hands over a piece per window, on ticks shared by every reply of the process
(the first piece at once; coalescer.py). After a read that held text, the reader reads
again only when the next piece is due, just before it is handed over: a steady stream is
read once a window, whatever its socket reads (Coalescer.pace, awaited by the stream
between reads; not once the stream has ended, and a wait ends when the body does).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from django.conf import settings

from collab.chat import metrics
from collab.chat.agent import AgentPlan, for_reply
from collab.chat.coalescer import Coalescer, ready
from collab.chat.steer import Legs, Note, Steer
from collab.llm import Finish, LLMError, Thought, Usage
from collab.llm.client import ChatMessage
from collab.llm.early_request import EarlyRequest
from collab.llm.pool import ProviderConfig, SharedSlots, stream_reply

log = logging.getLogger(__name__)

# How a reply that did not run to its end is stored (its stop reason -> status, note).
STOP_REASONS = {
    "stopped": ("stopped", ""),
    "interrupted": ("interrupted", "the server shut down mid-reply"),
}


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
    recipient_id: int | None = None  # a personal reply (`/each`): its frames go to this member only
    agent: AgentPlan | None = None  # an agent's run (agent.py): plan, tools, checks, then the answer
    # The provider's US dollars per million input and output tokens when the reply started:
    # its stored cost (replies/sink.py), with no read of the provider when it ends.
    price_per_m: tuple[Decimal, Decimal] = (Decimal(0), Decimal(0))
    # Its model request, if it was sent before the reply was stored and this job's request
    # is the very one (chat/replies/early.py): taken by the reply's stream, else cancelled.
    early: EarlyRequest | None = field(default=None, compare=False, repr=False)


@dataclass
class Outcome:
    text: str
    status: str  # done | stopped | failed | interrupted
    error: str = ""
    ttft_ms: float | None = None
    tokens: int = 0
    prompt_tokens: int | None = None
    duration_ms: float = 0.0
    tps: float | None = None
    reasoning: str = ""  # the model's thinking, apart from `text` (never sent back to it)
    finish_reason: str = ""  # why the model stopped when not its own end ("length"); else ""
    steps: int | None = None  # an agent run's model calls (agent.py); None: a plain reply


class Sink(Protocol):
    """Where a reply goes: supplied by the caller (replies/jobs.py)."""

    async def piece(self, offset: int, text: str) -> None: ...

    async def thought(self, offset: int, text: str) -> None:
        """A piece of the model's thinking: offsets of its own, from 0."""

    async def state(self, text: str) -> None: ...

    async def finish(self, outcome: Outcome) -> None: ...


@dataclass
class LiveReply:
    """A reply running in this process."""

    job: ReplyJob
    sink: Sink
    stop_reason: str = ""
    running: bool = False  # its task began: a stop cancels it (before: run_reply sees `stop_reason`)
    finishing: bool = False  # its outcome is being stored: a stop no longer cancels it
    task: asyncio.Task[None] | None = None
    parts: list[str] = field(default_factory=list)  # every token's text, in order
    thoughts: list[str] = field(default_factory=list)  # every thinking token's text, in order
    # What the admin's live page shows (status()): when it was started and got its first
    # token (time.monotonic()), and while it waits for a slot of its provider, its place
    # in the queue (1: next; 0: not waiting).
    started_at: float = field(default_factory=time.monotonic)
    first_at: float | None = None
    ahead: int = 0
    steps: int | None = None  # an agent run's model calls so far
    steer: Steer | None = None  # members' notes waiting for its next boundary (steer.py)
    streaming: bool = False  # a model request of a plain reply is under way (a steer may cut it)
    leg_from: int = 0  # where in `parts` its current request's answer begins

    def status(self) -> dict[str, Any]:
        """This reply as the live page shows it: tokens so far, and its rate (tokens after
        the first over the time since it came, as the stored tps), elapsed since it started."""
        now = time.monotonic()
        tokens = len(self.parts) + len(self.thoughts)
        since_first = now - self.first_at if self.first_at is not None else 0.0
        return {
            "id": self.job.message_id,
            "room": self.job.room_id,
            "provider": self.job.provider.name,
            "model": self.job.model,
            "state": "queued" if self.ahead else "writing",
            "ahead": self.ahead,
            "tokens": tokens,
            "chars": sum(len(p) for p in self.parts),
            "tps": round((tokens - 1) / since_first, 1) if tokens > 1 and since_first > 0 else 0.0,
            "elapsed_s": round(now - self.started_at, 2),
        }


async def run_reply(live: LiveReply, slots: SharedSlots | None = None) -> None:
    """Stream one reply through its sink; `sink.finish(outcome)` runs whatever happens."""
    job, sink = live.job, live.sink
    live.running = True
    coalescer = Coalescer(settings.COLLAB["COALESCE_MS"] / 1000, sink.piece)
    loop = asyncio.get_running_loop()
    started = loop.time()
    first_at: float | None = None
    chunks = 0
    usage: Usage | None = None
    status, error, finish_reason = "done", "", ""
    queued = False
    began = False  # a model request was sent (an agent sends several)
    # An agent's run is several requests and tool rounds: a few requests' time (agent.py).
    limit_s = job.provider.total_timeout_s * (min(job.agent.steps, 4) if job.agent is not None else 1)
    thinker: Coalescer | None = None  # the thinking's, made at its first piece (most models have none)
    paced: Coalescer | None = None  # whose next piece the reader waits for before reading again
    messages, legs, leg_chunks = job.messages, Legs(), 0  # a steered reply's requests (steer.py)

    def pace() -> asyncio.Future[None]:
        # Read again when that piece is due, all that came meanwhile at once: a read a
        # window, not one a socket read (Coalescer.pace). The stream skips it at its end,
        # and ends it when its body ends meanwhile.
        return paced.pace() if paced is not None else ready()

    async def on_queued(ahead: int) -> None:
        nonlocal queued
        queued = True
        live.ahead = max(ahead, 1)
        await sink.state(f"queued ({ahead} ahead)" if ahead > 1 else "queued")

    async def on_started(_base_url: str) -> None:
        nonlocal started, queued, began
        if first_at is None and (job.agent is None or not began):  # an agent's: from its first call
            started = loop.time()  # time to first token is the model's, not the queue's
            if job.early is not None and not job.early.taken and _base_url == job.early.endpoint.base_url:
                started = job.early.sent_at  # sent before the reply was stored: from then
        began = True
        live.ahead = 0
        if queued:
            queued = False
            await sink.state("writing…")

    try:
        if live.stop_reason:  # stopped before its task began: a task cancelled then would never run
            raise asyncio.CancelledError
        if job.agent is not None:  # the log is the reply's thinking channel (agent.py)
            thinker = Coalescer(settings.COLLAB["COALESCE_MS"] / 1000, sink.thought)
            run = for_reply(live, job.agent, coalescer, thinker, slots, on_queued, on_started)
            try:
                async with asyncio.timeout(limit_s):
                    await run.go()
            finally:
                first_at, chunks, finish_reason = run.first_at, run.chunks, run.finish_reason
                live.steps = run.calls
                usage = Usage(run.prompt_tokens, run.tokens)
            return
        while True:  # one model request, then one more after each steer (steer.py)
            live.leg_from, leg_chunks, usage, finish_reason, paced = len(live.parts), chunks, None, "", None
            try:
                live.streaming = True
                async with (
                    asyncio.timeout(limit_s),
                    aclosing(
                        stream_reply(
                            job.provider,
                            job.model,
                            messages,
                            temperature=job.temperature,
                            max_tokens=job.max_tokens,
                            on_queued=on_queued,
                            on_started=on_started,
                            slots=slots,
                            early=job.early if not legs.count else None,
                            pace=pace,
                        )
                    ) as stream,
                ):
                    async for items in stream:  # what one read of the model's stream held
                        if live.steer is not None:  # a member's note: the answer ends at a boundary
                            items = live.steer.clip(items, live.parts[-1] if len(live.parts) > live.leg_from else "")
                        answered = thought = False
                        for item in items:
                            if isinstance(item, str):  # the answer: the hot path
                                if first_at is None:
                                    first_at = loop.time()
                                    live.first_at = time.monotonic()
                                chunks += 1
                                live.parts.append(item)
                                coalescer.push(item)
                                answered = True
                            elif isinstance(item, Thought):
                                if first_at is None:
                                    first_at = loop.time()
                                    live.first_at = time.monotonic()
                                if thinker is None:
                                    thinker = Coalescer(settings.COLLAB["COALESCE_MS"] / 1000, sink.thought)
                                chunks += 1
                                live.thoughts.append(item.text)
                                thinker.push(item.text)
                                thought = True
                            elif isinstance(item, Usage):
                                usage = item
                            elif isinstance(item, Finish):
                                finish_reason = item.reason
                        # The answer's piece first: a read that held both waits for the answer's tick.
                        paced = coalescer if answered else thinker if thought else None
                        if live.steer is not None and live.steer.cut:
                            break
            except asyncio.CancelledError:
                if live.stop_reason or live.steer is None or not live.steer.cancelled:
                    raise
                task = asyncio.current_task()
                assert task is not None
                task.uncancel()  # it was the steer's own cut: the reply goes on
            finally:
                live.streaming = False
            steered, live.steer = live.steer, None
            if steered is None:  # the model's own end (or its token limit): the reply's
                break
            if job.early is not None:  # the first request's, if its stream never took it
                job.early.cancel()
            legs.add(usage, chunks - leg_chunks, messages)  # then the marker, and the next request
            messages = steered.go_on(messages, live.parts, live.leg_from, coalescer.push)
    except LLMError as exc:
        status, error = "failed", exc.message
        log.warning("reply %s failed: %s", job.message_id, exc)
    except TimeoutError:
        status, error = "failed", f"the reply took longer than {limit_s:g} s"
    except asyncio.CancelledError:
        # stop() names a reason; any other cancellation is the process going away.
        status, error = STOP_REASONS.get(live.stop_reason, ("interrupted", "the server stopped mid-reply"))
    except Exception:  # a bug must not leave the reply streaming forever
        log.exception("reply %s crashed", job.message_id)
        status, error = "failed", "internal error"
    finally:
        live.finishing = True
        if job.early is not None:  # stopped before its stream took it: given up (no-op once taken)
            job.early.cancel()
        if thinker is not None:
            await thinker.close()
        usage = legs.total(usage, chunks - leg_chunks, messages)  # every request's, once steered
        await _finish(live, coalescer, status, error, started, first_at, chunks, usage, finish_reason)


async def _finish(
    live: LiveReply,
    coalescer: Coalescer,
    status: str,
    error: str,
    started: float,
    first_at: float | None,
    chunks: int,
    usage: Usage | None,
    finish_reason: str = "",
) -> None:
    await coalescer.close()
    ended = asyncio.get_running_loop().time()
    tokens = usage.completion_tokens if usage and usage.completion_tokens is not None else chunks
    streaming_s = ended - first_at if first_at is not None else 0.0
    outcome = Outcome(
        text="".join(live.parts),  # all that was read, also what a failed sink never sent
        status=status,
        error=error,
        ttft_ms=(first_at - started) * 1000 if first_at is not None else None,
        tokens=tokens,
        prompt_tokens=usage.prompt_tokens if usage else None,
        duration_ms=(ended - started) * 1000,
        # Tokens after the first, over the time they took: the stream's own rate.
        # (None for an agent's run: its time holds tools and several calls)
        tps=(tokens - 1) / streaming_s if tokens > 1 and streaming_s > 0 and live.steps is None else None,
        reasoning="".join(live.thoughts),
        finish_reason=finish_reason if status == "done" else "",
        steps=live.steps,
    )
    metrics.REPLIES.labels(status).inc()
    metrics.REPLY_TOKENS.inc(tokens)
    if outcome.ttft_ms is not None:
        metrics.REPLY_TTFT.observe(outcome.ttft_ms / 1000)
    try:
        await asyncio.shield(live.sink.finish(outcome))
    except Exception:
        log.exception("could not finish reply %s", live.job.message_id)


class Registry:
    """The replies running in this process, by message id."""

    def __init__(self) -> None:
        self._live: dict[int, LiveReply] = {}

    def start(self, job: ReplyJob, sink: Sink, slots: SharedSlots | None = None) -> LiveReply:
        """Run a reply; `slots` keeps its provider's deployment-wide cap, if it has one."""
        live = LiveReply(job, sink)
        self._live[job.message_id] = live
        metrics.REPLIES_STREAMING.inc()
        task = asyncio.get_running_loop().create_task(run_reply(live, slots), name=f"reply-{job.message_id}")
        live.task = task
        task.add_done_callback(lambda _t: self._ended(job))
        return live

    def _ended(self, job: ReplyJob) -> None:
        self._live.pop(job.message_id, None)
        metrics.REPLIES_STREAMING.dec()
        if job.early is not None:  # a request sent before the reply was stored (chat/replies/early.py)
            job.early.cancel()  # stopped before its first step: run_reply's own cancel never ran
            metrics.EARLY_REQUESTS.labels("taken" if job.early.used else "wasted").inc()

    def get(self, message_id: int) -> LiveReply | None:
        return self._live.get(message_id)

    def ids(self) -> list[int]:
        return list(self._live)

    def running(self) -> list[LiveReply]:
        return list(self._live.values())

    def in_room(self, room_id: int) -> list[int]:
        return [i for i, live in self._live.items() if live.job.room_id == room_id]

    def stop(self, message_id: int, reason: str = "stopped") -> bool:
        """Cancel a running reply; True if it runs here (one already finishing just ends)."""
        live = self._live.get(message_id)
        if live is None or live.task is None or live.task.done():
            return False
        if not live.finishing:
            live.stop_reason = reason
            if live.running:
                live.task.cancel()
        return True

    def steer(self, message_id: int, note: Note) -> bool | None:
        """Hand a member's note to a reply running here (steer.py): None when none runs
        here; False when it may not take one (it is ending, or an agent's run)."""
        live = self._live.get(message_id)
        if live is None or live.task is None or live.task.done():
            return None
        if live.finishing or live.stop_reason or live.job.agent is not None:
            return False
        if live.steer is not None:  # a boundary is awaited already: both notes go at once
            live.steer.notes.append(note)
            return True
        steer = live.steer = Steer([note], now=len(live.parts) == live.leg_from)
        if steer.now:  # no answer yet: nothing to finish first
            self._cut(live, steer)
        steer.arm(lambda: self._cut(live, steer))  # a model gone silent: cut as it stands
        return True

    @staticmethod
    def _cut(live: LiveReply, steer: Steer) -> None:
        """End the reply's current model request now, for its steer (not a stop)."""
        if live.steer is steer and not steer.cut and live.streaming and not live.finishing and live.task is not None:
            steer.cancelled = True
            live.task.cancel()

    def __len__(self) -> int:
        return len(self._live)

    async def wait_idle(self) -> None:
        """Wait until no reply is running (tests and shutdown); the caller bounds the
        wait with asyncio.timeout."""
        while self._live:
            await asyncio.wait([lr.task for lr in self._live.values() if lr.task is not None])
            await asyncio.sleep(0)  # let the done-callbacks unregister the finished ones


registry = Registry()
