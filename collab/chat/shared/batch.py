"""One Redis script's calls, gathered while the loop turns and sent as one pipeline.

Every streaming reply's piece runs the sink's script (APPEND_PUBLISH: the text appended,
the frame published), once per window. The coalescers' windows end together on the
process's clock (coalescer.WindowClock), so the pieces of all the replies this process
streams are handed over in one loop turn; here their calls go to Redis as one pipeline
(one write, one read), for a fraction of the CPU that as many calls of their own cost
(docs/benchmarks/2026-12-04.md#b-pipeline-per-window). Calls made while a pipeline is in
flight go in the next one. Each caller still gets its own result or error.

The script is called by its SHA; a Redis that lost it (restarted) answers NOSCRIPT: the
script is loaded again and those calls sent again. The sink's script is safe to send
twice (it appends a text only once: shared/redis_scripts.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError


class ScriptBatch:
    def __init__(self, redis: aioredis.Redis, script: AsyncScript) -> None:
        self._redis = redis
        self._script = script
        self._calls: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def __call__(self, keys: list[str], args: list[Any]) -> Any:
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Any] = loop.create_future()
        self._calls.append(((len(keys), *keys, *args), result))
        if self._sender is None:  # runs once the loop turn's callers have all queued
            self._sender = loop.create_task(self._send())
            self._sender.add_done_callback(self._sender_done)
        return await result

    async def _send(self) -> None:
        try:
            while self._calls:
                calls, self._calls = self._calls, []
                try:
                    await self._run([c for c in calls if not c[1].done()])  # a caller gone: not sent
                except BaseException as exc:  # cancelled (the loop ends): its callers are told
                    _fail(calls, _unsent(exc))
                    raise
        finally:
            self._sender = None

    def _sender_done(self, task: asyncio.Task[None]) -> None:
        """A sender cancelled before its first step never ran its `finally`: the calls
        that wait for it fail (never hang), and the next call starts a sender again."""
        if self._sender is task:
            self._sender = None
        if task.cancelled() and self._sender is None and self._calls:
            calls, self._calls = self._calls, []
            _fail(calls, _unsent(asyncio.CancelledError()))

    async def _run(self, calls: list[tuple[tuple[Any, ...], asyncio.Future[Any]]], reload: bool = True) -> None:
        if not calls:
            return
        pipe = self._redis.pipeline(transaction=False)
        for args, _ in calls:
            pipe.evalsha(self._script.sha, *args)
        try:
            results = await pipe.execute(raise_on_error=False)
        except Exception as exc:  # Redis away, a timeout: every caller learns it
            _fail(calls, exc)
            return
        lost = [call for call, got in zip(calls, results, strict=True) if isinstance(got, NoScriptError)]
        if lost and reload:
            try:
                await self._redis.script_load(self._script.script)
            except Exception as exc:
                _fail(lost, exc)
            else:
                await self._run(lost, reload=False)
        for (_, result), got in zip(calls, results, strict=True):
            if result.done():  # its caller was cancelled, or answered by the reload
                continue
            if isinstance(got, Exception):
                result.set_exception(got)
            else:
                result.set_result(got)


def _unsent(exc: BaseException) -> Exception:
    """What a caller whose call was cut short with the batch is told: an error of the
    shared state (the sink keeps its text and restores it later), not a cancellation
    of its own task."""
    if isinstance(exc, Exception):
        return exc
    return RedisConnectionError("the pipeline was cancelled before Redis answered")


def _fail(calls: list[tuple[tuple[Any, ...], asyncio.Future[Any]]], exc: Exception) -> None:
    for _, result in calls:
        if not result.done():
            result.set_exception(exc)
