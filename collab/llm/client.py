"""Streaming chat completions from any OpenAI-compatible endpoint.

One `AsyncOpenAI` per endpoint and event loop, reused (its connection pool is bound to
the loop that opened it). The stream is read as raw SSE bytes through the SDK's raw
POST and decoded here: the SDK's typed chunk objects cost many times a raw event's
parse (docs/benchmarks/2026-12-02.md#b-streaming-fixes), and the SDK still does URL,
auth, headers, retries before the first byte and error mapping.

Below the SDK, the HTTP transport is aiohttp's (the SDK's own `DefaultAioHttpClient`,
`openai[aiohttp]`): its C parser hands over whole socket reads, where httpx's default
transport costs a trip through httpcore, h11 and anyio per chunk
(docs/benchmarks/2026-12-03.md#b-aiohttp). `COLLAB_LLM_HTTP=httpx` selects the default one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import httpx2
import openai
import orjson

from collab.llm.tool_calls import Calls, ToolCall

# A chat message as the API takes it: {"role": ..., "content": ...}, an assistant's
# {"role": "assistant", "content": str | None, "tool_calls": [...]}, a tool result's
# {"role": "tool", "tool_call_id": ..., "content": ...}.
ChatMessage = dict[str, Any]

if TYPE_CHECKING:
    from collab.llm.early_request import EarlyRequest

try:  # the SDK's aiohttp transport (`openai[aiohttp]`), whose body _sse_data reads itself
    from openai._vendor.httpx_aiohttp.transport import AiohttpResponseStream as _AiohttpStream
    from openai._vendor.httpx_aiohttp.transport import map_aiohttp_exceptions as _map_aiohttp_errors
except ImportError:  # moved in a later SDK: read through httpx, as with its own transport
    _AiohttpStream = None  # type: ignore[assignment,misc]


@dataclass(frozen=True)
class Endpoint:
    """Where and how to call a model. `api_key_env` names the variable holding the key."""

    base_url: str
    api_key_env: str = ""
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    total_timeout_s: float = 300.0
    max_retries: int = 2
    key_allowed: bool = True  # False: the operator did not allow this variable (never read)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int | None
    completion_tokens: int | None


@dataclass(frozen=True, slots=True)
class Thought:
    """A piece of a reasoning model's thinking, streamed before (apart from) its answer:
    vLLM's `delta.reasoning_content`, Cerebras' and OpenRouter's `delta.reasoning`."""

    text: str


@dataclass(frozen=True, slots=True)
class Finish:
    """Why the model stopped, when it was not its own end ("stop"): "length" (cut off
    at max_tokens), "content_filter", ... Yielded once, after the last piece."""

    reason: str


class LLMError(Exception):
    """A failed call. `kind` is one of: config, connect, timeout, rate_limited, quota,
    auth, bad_request, server, dropped, stalled."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


# Per event loop (the object, not its id: a new loop may reuse a closed one's address),
# then per endpoint, key and transport.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Endpoint, str, str], openai.AsyncOpenAI]] = (
    weakref.WeakKeyDictionary()
)
_closing: set[asyncio.Task[None]] = set()

# "aiohttp" (the default) or "httpx": the transport under the SDK, read when a client is made.
HTTP_BACKENDS = ("aiohttp", "httpx")


def http_backend() -> str:
    backend = os.environ.get("COLLAB_LLM_HTTP", "aiohttp") or "aiohttp"
    if backend not in HTTP_BACKENDS:
        raise LLMError("config", f"COLLAB_LLM_HTTP must be one of {', '.join(HTTP_BACKENDS)}, not {backend[:20]!r}")
    return backend


def _api_key(endpoint: Endpoint) -> str:
    if not endpoint.api_key_env:
        return "no-key"  # local servers ignore it; the SDK insists on a value
    if not endpoint.key_allowed:
        raise LLMError("config", f"{endpoint.api_key_env} is not an allowed key variable (README: provider keys)")
    key = os.environ.get(endpoint.api_key_env, "")
    if not key:
        # The variable's name is safe to show; its value never is.
        raise LLMError("config", f"the environment variable {endpoint.api_key_env} is not set")
    return key


async def _final_quota(response: httpx2.Response) -> None:
    """An exhausted quota is final: tell the SDK not to retry it as it retries other 429s
    (the SDK obeys `x-should-retry`; it reads nothing else of a 429 before retrying)."""
    if response.status_code == 429:
        await response.aread()
        if b"insufficient_quota" in response.content:
            response.headers["x-should-retry"] = "false"


def client_for(endpoint: Endpoint) -> openai.AsyncOpenAI:
    key = _api_key(endpoint)
    loop = asyncio.get_running_loop()
    # The key is part of the cache key so that a rotated key takes effect; it is held
    # in memory only, as the SDK itself holds it.
    backend = http_backend()
    cache_key = (endpoint, key, backend)
    mine = _clients.setdefault(loop, {})
    client = mine.get(cache_key)
    if client is None:
        # This loop's client of the endpoint with a rotated key or another transport: closed.
        for stale in [k for k in mine if k[0] == endpoint]:
            task = loop.create_task(mine.pop(stale).close())
            _closing.add(task)  # held until done: the loop keeps only a weak reference
            task.add_done_callback(_closing.discard)
        timeout = httpx2.Timeout(
            connect=endpoint.connect_timeout_s,
            read=endpoint.read_timeout_s,
            write=endpoint.read_timeout_s,
            pool=endpoint.connect_timeout_s,
        )
        http_client = openai.DefaultAioHttpClient if backend == "aiohttp" else openai.DefaultAsyncHttpxClient
        client = openai.AsyncOpenAI(
            api_key=key,
            base_url=endpoint.base_url,
            timeout=timeout,
            max_retries=endpoint.max_retries,
            http_client=http_client(timeout=timeout, event_hooks={"response": [_final_quota]}),
        )
        mine[cache_key] = client
    return client


async def aclose_clients() -> None:
    """Close the clients of the running loop (tests, and a server shutting down)."""
    for client in _clients.pop(asyncio.get_running_loop(), {}).values():
        await client.close()


def _status_error(exc: openai.APIStatusError) -> LLMError:
    body = exc.body if isinstance(exc.body, dict) else {}
    code = str(body.get("code") or body.get("type") or "")
    if exc.status_code == 429:
        if "quota" in code:
            return LLMError("quota", "the provider's quota is exhausted")
        return LLMError("rate_limited", "the provider is rate limiting requests; try again shortly")
    if exc.status_code in (401, 403):
        return LLMError("auth", f"the provider refused the key (HTTP {exc.status_code})")
    if exc.status_code >= 500:
        return LLMError("server", f"the provider failed (HTTP {exc.status_code})")
    return LLMError("bad_request", f"the provider rejected the request (HTTP {exc.status_code}): {exc.message}"[:300])


def _aiohttp_body(response: httpx2.Response) -> aiohttp.StreamReader | None:
    """The body of a response that the SDK's aiohttp transport read and did not encode,
    as aiohttp holds it; else None (httpx's transport, or a compressed body: its bytes
    then come through httpx, which decodes them). Read here, a socket read costs one
    call, where httpx's `aiter_bytes` passes it through four generators of its own and
    the transport's (docs/benchmarks/2026-12-04.md#b-frame-path);
    tests/test_llm_client.py checks that the shipped transport is read so."""
    bound = response.stream
    stream = getattr(bound, "_stream", None)  # httpx's BoundAsyncStream around the transport's
    if _AiohttpStream is None or type(stream) is not _AiohttpStream:
        return None
    if response.headers.get("content-encoding", "identity").strip().lower() != "identity":
        return None
    raw = getattr(stream, "_aiohttp_response", None)
    body = getattr(raw, "content", None)
    return body if isinstance(body, aiohttp.StreamReader) else None


async def _sse_data(response: httpx2.Response) -> AsyncGenerator[list[bytes], None]:
    """The `data:` payloads of a server-sent-events body, split by hand from the raw
    bytes (httpx's line decoder costs more than the JSON): a list per socket read, of the
    events it completed (a loaded process reads several at once: one step of this
    generator and of its readers per read, not per event;
    docs/benchmarks/2026-12-04.md#b-read-events). Comments (": ping"), blank separators
    and other fields are skipped. The caller closes `response` (read from aiohttp, the stream does not
    close it at its end as httpx's `aiter_raw` does)."""
    body = _aiohttp_body(response)
    # aiohttp's errors as the transport maps them (to httpx2's), as `aiter_bytes` would.
    blocks = response.aiter_bytes() if body is None else body.iter_any()
    with contextlib.nullcontext() if body is None else _map_aiohttp_errors():
        pending = b""
        async for block in blocks:
            pending += block
            *lines, pending = pending.split(b"\n")
            data = [line[5:].strip() for line in lines if line.startswith(b"data:")]
            if data:
                yield data


def _timed_out(exc: BaseException) -> bool:
    """Whether a transport error is a timeout. The SDK's aiohttp transport maps aiohttp's
    connection errors to httpx2.ConnectTimeout (its `map_aiohttp_exceptions`), a refused
    connection and one closed before the status line included: the aiohttp error it was
    raised from tells, and only one that is itself a timeout is one."""
    if isinstance(exc, openai.APITimeoutError) and isinstance(exc.__cause__, httpx2.TimeoutException):
        exc = exc.__cause__  # the SDK's, raised from the transport's
    if not isinstance(exc, (openai.APITimeoutError, httpx2.TimeoutException)):
        return False
    cause = exc.__cause__
    return not type(cause).__module__.startswith("aiohttp") or isinstance(cause, TimeoutError)


def request_body(
    model: str,
    messages: Sequence[ChatMessage],
    temperature: float | None = None,
    max_tokens: int | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | None = None,
) -> dict[str, Any]:
    """The streaming request's JSON body (also what an early request is matched on)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": list(messages),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if temperature is not None:
        body["temperature"] = temperature
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if tools:
        body["tools"] = tools
        if tool_choice:
            body["tool_choice"] = tool_choice
    return body


# What a stream yields, a list per socket read: its text pieces, thoughts, tool calls,
# usage and end, in the order the provider sent them.
Item = str | Thought | ToolCall | Usage | Finish


class _Chunks:
    """The events of one stream, decoded as they come: what each read's events hold, the
    tool calls being assembled, and the finish_reason once one came."""

    def __init__(self) -> None:
        self.calls = Calls()  # tool calls being assembled (rare: a plain reply has none)
        self.finished = ""  # the finish_reason, once one came

    def take(self, events: list[bytes], items: list[Item]) -> bool:
        """Append what `events` hold to `items`; True at the stream's [DONE]. Raises
        LLMError for a malformed event or an error event (`items` holds what came before)."""
        for data in events:
            if data == b"[DONE]":
                # Without a finish_reason first, [DONE] means cut short (llama.cpp's
                # server ends an interrupted stream so): not a complete reply.
                return True
            try:
                chunk = orjson.loads(data)  # once per event (docs/benchmarks/2026-12-03.md#b-faster-parts)
            except ValueError as exc:  # orjson.JSONDecodeError is one
                raise LLMError("server", "the provider sent a malformed chunk") from exc
            if type(chunk) is not dict:  # JSON, but no chunk (`data: 5`)
                raise LLMError("server", "the provider sent a malformed chunk")
            if "error" in chunk:
                err = chunk["error"]
                message = err.get("message", "error") if isinstance(err, dict) else str(err)
                raise LLMError("server", f"the provider reported an error mid-stream: {message}"[:300])
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                content = delta.get("content")
                # A plain content chunk ({"content": ...}) pays one length check here
                # (docs/benchmarks/2026-12-03.md#b-thinking-replies); a chunk at the switch
                # may hold both fields.
                if not content or len(delta) > 1:
                    thought = delta.get("reasoning_content") or delta.get("reasoning")
                    if thought:
                        items.append(Thought(thought))
                    fragments = delta.get("tool_calls")
                    if fragments:
                        self.calls.add(fragments)
                    elif delta.get("function_call"):  # the legacy single call
                        self.calls.add([{"index": 0, "function": delta["function_call"]}])
                if content:
                    items.append(content)
                if choice.get("finish_reason"):
                    self.finished = choice["finish_reason"]
                    if "x_groq" in chunk and not chunk.get("usage"):
                        # Groq: the usage in the finish chunk's `x_groq`, read here
                        # (once a stream) so that a plain chunk pays nothing for it.
                        groq = chunk["x_groq"]
                        if isinstance(groq, dict) and isinstance(groq.get("usage"), dict):
                            chunk["usage"] = groq["usage"]
                    if self.calls:
                        items.extend(self.calls.done())
                        self.calls = Calls()
            usage = chunk.get("usage")
            if usage:
                items.append(Usage(usage.get("prompt_tokens"), usage.get("completion_tokens")))
        return False


# Ends of a reply that are its own: no `Finish` item.
_NORMAL_ENDS = frozenset({"stop", "tool_calls", "function_call"})


async def stream_chat(
    endpoint: Endpoint,
    model: str,
    messages: Sequence[ChatMessage],
    *,
    temperature: float | None = None,
    max_tokens: int | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | None = None,
    early: EarlyRequest | None = None,
    pace: Callable[[], asyncio.Future[None]] | None = None,
) -> AsyncGenerator[list[Item], None]:
    """Yield the reply's text pieces as they arrive (its thinking as `Thought`s), then
    the `ToolCall`s it asks for (when `tools` were offered; once the finish_reason came),
    then a `Usage` if the provider sent one, then a `Finish` if it stopped for another
    reason than its own end or its tool calls (docs/wire.md: "length"). They come in a
    list per read of the stream (never empty), each text piece one chunk of the model's.

    `tools`: OpenAI function-calling schemas, sent when not empty; `tool_choice` with them
    ("none": the model must answer in text, though the request holds tool turns; unset:
    the provider's default, "auto").

    `early`: this request, if it was already sent (llm/early_request.py) to this endpoint with
    this very body; it is taken instead of a new one, else cancelled.

    `pace`: called after each list for a wait, awaited before the stream is read again,
    unless the stream has ended (its finish_reason or [DONE] came): the engine reads once
    a window so (Coalescer.pace), and the end of a reply never waits for it. When the
    response's body ends during the wait (an uncompressed body read through aiohttp, the
    SDK's default here), the wait is resolved then: what is left is read at once.

    Raises LLMError for every failure, before or after the first piece. The caller
    applies the total timeout (it owns the clock that also covers its own work).
    """
    client = client_for(endpoint)
    body = request_body(model, messages, temperature, max_tokens, tools, tool_choice)
    chunks = _Chunks()
    responded = False  # past the status line: a failure from here on is mid-stream
    try:
        # The SDK's own POST (base URL, auth, headers, retries, status errors), without
        # `chat.completions.create`'s params transform, which holds the event loop (every
        # stream of the process) for longer the longer the history
        # (docs/benchmarks/2026-12-02.md#b-first-profile).
        if early is not None and early.fits(endpoint, body):  # sent before the reply was stored
            response = await early.response()
        else:
            if early is not None:
                early.cancel()
            response = await client.post("/chat/completions", body=body, cast_to=httpx2.Response, stream=True)
        responded = True
        events = _sse_data(response)
        waiting: asyncio.Future[None] | None = None  # the reader's pace, while it waits
        received = _aiohttp_body(response) if pace is not None else None
        if received is not None:

            def ended() -> None:
                # The body's end came while the reader waits for its window: its last
                # tokens and its end are read now, and the final goes without waiting
                # for the tick (docs/benchmarks/2026-12-05.md#b-body-end).
                if waiting is not None and not waiting.done():
                    waiting.set_result(None)

            received.on_eof(ended)
        try:
            async for data in events:
                items: list[Item] = []
                try:
                    done = chunks.take(data, items)
                except Exception:  # what came before the failure is the reply's
                    if items:
                        yield items
                    raise
                if items:
                    yield items
                if done:
                    break
                if pace is not None and items and not chunks.finished:
                    waiting = pace()
                    await waiting
        finally:
            await events.aclose()
            await response.aclose()
    except (openai.APIConnectionError, httpx2.TransportError) as exc:  # timeouts among them
        if _timed_out(exc):
            if responded:
                raise LLMError("stalled", "the provider stopped sending mid-reply") from exc
            raise LLMError("timeout", "the provider did not answer in time") from exc
        if responded:
            raise LLMError("dropped", "the connection to the provider broke mid-reply") from exc
        raise LLMError("connect", "could not reach the provider") from exc
    except openai.APIStatusError as exc:
        raise _status_error(exc) from exc
    if not chunks.finished:
        raise LLMError("dropped", "the provider's stream ended before the reply was complete (no finish_reason)")
    if chunks.finished not in _NORMAL_ENDS:
        yield [Finish(str(chunks.finished)[:20])]  # Message.finish_reason holds 20 characters
