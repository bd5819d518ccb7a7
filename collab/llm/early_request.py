"""A model request sent before its reply exists (docs/architecture.md#a-early-requests).

The caller guesses a reply's request from what it already knows, sends it, and goes on
storing the post. Once the reply's job is built from what was stored, `stream_chat`
takes the request only if the job's endpoint and JSON body are the very ones sent
(`fits`); any other is cancelled. A guess can cost a wasted request, never a wrong one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx2

from collab.llm.client import Endpoint, client_for

log = logging.getLogger(__name__)


class EarlyRequest:
    """One POST of a streaming chat completion, in flight from construction on."""

    def __init__(self, endpoint: Endpoint, body: dict[str, Any]) -> None:
        self.endpoint = endpoint
        self.body = body
        self.taken = False  # by a reply (`response`), or given up (`cancel`): never twice
        self.used = False  # answered, and its reply reads it (`response`): not a wasted request
        loop = asyncio.get_running_loop()
        self.sent_at = loop.time()  # the reply's time to first token counts from here
        client = client_for(endpoint)  # LLMError("config") here: nothing was sent
        post = client.post("/chat/completions", body=body, cast_to=httpx2.Response, stream=True)
        self._task: asyncio.Task[httpx2.Response] = loop.create_task(post)

    def fits(self, endpoint: Endpoint, body: dict[str, Any]) -> bool:
        return not self.taken and endpoint == self.endpoint and body == self.body

    async def response(self) -> httpx2.Response:
        """The response, as `client.post` returns it or raises."""
        self.taken = True
        try:
            response = await self._task
        except asyncio.CancelledError:  # the reply stopped: nothing may stay open
            if not self._task.cancel():  # it was answered just as the reply stopped
                self._task.add_done_callback(_close)
            raise
        self.used = True  # answered: the reply reads this request's stream
        return response

    @property
    def closed(self) -> bool:
        """Ended with nothing left open: cancelled, failed, or its response closed."""
        task = self._task
        return task.done() and (task.cancelled() or task.exception() is not None or task.result().is_closed)

    def cancel(self) -> None:
        """Give the request up (idempotent; a taken one is its reply's to close)."""
        if self.taken:
            return
        self.taken = True
        if self._task.cancel():
            return
        self._task.add_done_callback(_close)  # already answered: its response is closed


def _close(task: asyncio.Task[httpx2.Response]) -> None:
    if task.cancelled() or task.exception() is not None:  # retrieved: nothing to close
        return
    closing = asyncio.get_running_loop().create_task(task.result().aclose())
    _closing.add(closing)  # held until done: the loop keeps only a weak reference
    closing.add_done_callback(_closing.discard)


_closing: set[asyncio.Task[None]] = set()
