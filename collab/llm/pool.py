"""A provider as callers see it: a pool of endpoints behind one concurrency cap.

- Each request waits for a slot (FIFO) when the provider's `max_concurrency` streams
  are already running in this process; the caller is told it is queued. A cap for the
  whole deployment (`deployment_max_concurrency`, every server process together) is
  kept by a `SharedSlots` that the caller supplies (in Redis).
- It then goes to the healthy endpoint with the fewest streams in flight. An endpoint
  that fails before the first token is avoided for `unhealthy_s` and the request moves
  on to the next one; a failure after the first token is reported, never retried (the
  members have already seen part of the reply).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol

from collab.llm.client import ChatMessage, Endpoint, Item, LLMError, Thought, ToolCall, stream_chat
from collab.llm.early_request import EarlyRequest

log = logging.getLogger(__name__)

# Failures that say nothing about the endpoint's health: moving on would not help.
_NOT_ENDPOINT_FAULTS = {"quota", "auth", "bad_request", "config"}


@dataclass(frozen=True)
class ProviderConfig:
    name: str
    base_urls: tuple[str, ...]
    api_key_env: str = ""
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    total_timeout_s: float = 300.0
    max_retries: int = 2
    max_concurrency: int = 0  # 0: no cap (per server process)
    unhealthy_s: float = 30.0
    deployment_max_concurrency: int = 0  # 0: no cap (all server processes together)
    key_allowed: bool = True

    def endpoint(self, base_url: str) -> Endpoint:
        return Endpoint(
            base_url=base_url,
            api_key_env=self.api_key_env,
            connect_timeout_s=self.connect_timeout_s,
            read_timeout_s=self.read_timeout_s,
            total_timeout_s=self.total_timeout_s,
            max_retries=self.max_retries,
            key_allowed=self.key_allowed,
        )


class SharedSlots(Protocol):
    """A deployment-wide cap: at most `cap` streams of provider `name` at once."""

    async def acquire(self, name: str, cap: int, on_queued: Callable[[int], Awaitable[None]] | None) -> str:
        """Wait for a slot (first come, first served); returns its token."""
        ...

    async def release(self, name: str, token: str) -> None: ...


@dataclass
class EndpointState:
    url: str
    in_flight: int = 0
    unhealthy_until: float = 0.0
    failures: int = 0

    def healthy(self, now: float) -> bool:
        return now >= self.unhealthy_until


@dataclass
class Pool:
    config: ProviderConfig
    endpoints: list[EndpointState] = field(default_factory=list)
    running: int = 0
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)

    def candidates(self) -> list[EndpointState]:
        """Healthy endpoints, fewest streams first (ties: listed order); then the
        unhealthy ones, soonest to recover first, as a last resort."""
        now = time.monotonic()
        healthy = sorted((e for e in self.endpoints if e.healthy(now)), key=lambda e: e.in_flight)
        sick = sorted((e for e in self.endpoints if not e.healthy(now)), key=lambda e: e.unhealthy_until)
        return healthy + sick

    async def acquire(self, on_queued: Callable[[int], Awaitable[None]] | None) -> None:
        cap = self.config.max_concurrency
        if not cap or (self.running < cap and not self.waiters):
            self.running += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            if on_queued is not None:
                await on_queued(len(self.waiters))
            await waiter  # release() hands its slot straight to the first waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot arrived as we were cancelled: pass it on
            else:
                self.waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot moves to it; `running` is unchanged
                return
        self.running -= 1


_pools: dict[tuple[int, str], Pool] = {}


def pool_for(config: ProviderConfig) -> Pool:
    """One pool per provider and event loop; a changed configuration keeps the
    in-flight counts and health of the endpoints that remain."""
    key = (id(asyncio.get_running_loop()), config.name)
    pool = _pools.get(key)
    if pool is None:
        pool = _pools[key] = Pool(config, [EndpointState(u) for u in config.base_urls])
    elif pool.config != config:
        known = {e.url: e for e in pool.endpoints}
        pool.endpoints = [known.get(u) or EndpointState(u) for u in config.base_urls]
        pool.config = config
    return pool


def first_url(config: ProviderConfig) -> str | None:
    """The endpoint a request of this provider would go to now, read without changing its
    pool; None if the pool runs another configuration than `config` (it is stale)."""
    pool = _pools.get((id(asyncio.get_running_loop()), config.name))
    if pool is None:
        return config.base_urls[0] if config.base_urls else None
    if pool.config != config or not pool.endpoints:
        return None
    return pool.candidates()[0].url


async def stream_reply(
    config: ProviderConfig,
    model: str,
    messages: Sequence[ChatMessage],
    *,
    temperature: float | None = None,
    max_tokens: int | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | None = None,
    on_queued: Callable[[int], Awaitable[None]] | None = None,
    on_started: Callable[[str], Awaitable[None]] | None = None,
    slots: SharedSlots | None = None,
    early: EarlyRequest | None = None,
    pace: Callable[[], asyncio.Future[None]] | None = None,
) -> AsyncGenerator[list[Item], None]:
    """Like `stream_chat` (a list of items per read, `pace` awaited between reads), through
    the provider's queues and endpoint pool.

    `on_queued(position)` is awaited if the request must wait for a slot,
    `on_started(base_url)` when a request is sent to an endpoint. `early`: the request,
    already sent (llm/early_request.py); its endpoint is tried first if healthy, and takes it if
    it fits, else it is cancelled.
    """
    pool = pool_for(config)
    try:
        await pool.acquire(on_queued)
    except BaseException:
        if early is not None:
            early.cancel()
        raise
    token = ""
    try:
        if slots is not None and config.deployment_max_concurrency:
            token = await slots.acquire(config.name, config.deployment_max_concurrency, on_queued)
        error: LLMError | None = None
        candidates = pool.candidates()
        if early is not None:  # the endpoint it was sent to first, if healthy: the request is taken
            now = time.monotonic()
            sent_to = [e for e in candidates if e.url == early.endpoint.base_url and e.healthy(now)]
            candidates = sent_to + [e for e in candidates if e not in sent_to]
        for endpoint in candidates:
            got_text = False
            endpoint.in_flight += 1
            try:
                if on_started is not None:
                    await on_started(endpoint.url)
                stream = stream_chat(
                    config.endpoint(endpoint.url),
                    model,
                    messages,
                    temperature=temperature,
                    max_tokens=max_tokens,
                    tools=tools,
                    tool_choice=tool_choice,
                    early=early,
                    pace=pace,
                )
                early = None  # the first endpoint's to take or cancel; another sends its own
                async with aclosing(stream):
                    async for items in stream:
                        # Shown, or acted on (a tool call runs): no other endpoint.
                        if not got_text:
                            got_text = any(isinstance(item, (str, Thought, ToolCall)) for item in items)
                        yield items
                endpoint.failures = 0
                return
            except LLMError as exc:
                if got_text or exc.kind in _NOT_ENDPOINT_FAULTS:
                    raise
                endpoint.failures += 1
                endpoint.unhealthy_until = time.monotonic() + config.unhealthy_s
                error = exc
            finally:
                endpoint.in_flight -= 1
        assert error is not None
        if len(pool.endpoints) > 1:
            error = LLMError(error.kind, f"{error.message} (all {len(pool.endpoints)} endpoints failed)")
        raise error
    finally:
        if early is not None:  # never reached an endpoint (a slot's wait failed)
            early.cancel()
        pool.release()
        if token and slots is not None:
            try:
                await asyncio.shield(slots.release(config.name, token))
            except Exception:  # the slot's lease frees it by itself; the reply is not at fault
                log.warning("could not release a %s slot", config.name, exc_info=True)
