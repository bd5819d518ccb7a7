"""`stream_chat` against the byte shapes each provider's OpenAI-compatible stream really
has (issue 9), on both HTTP transports under the SDK (`COLLAB_LLM_HTTP`: aiohttp, httpx).

A socket-level server writes the exact body in chosen write boundaries (one write per
event; cut inside "data:", between \\r and \\n and inside UTF-8 characters; one byte per
write), with a drain after each, framed chunked, by Connection: close with no length, or
by Content-Length."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from collab.llm import Endpoint, Finish, Item, LLMError, Thought, ToolCall, Usage, stream_chat
from collab.llm.client import aclose_clients


@pytest.fixture(params=["aiohttp", "httpx"])
async def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    monkeypatch.setenv("COLLAB_LLM_HTTP", request.param)
    yield request.param
    await aclose_clients()


def sse(body: dict[str, Any], end: bytes = b"\n") -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode() + end + end


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    """OpenAI's chunk: `usage: null` on every chunk when include_usage was asked."""
    return {"id": "chatcmpl-B9", "object": "chat.completion.chunk", "created": 1764777600, "model": "gpt-4o-mini",
            "system_fingerprint": "fp_f85bea6784", "choices": [{"index": 0, "delta": delta, "logprobs": None,
            "finish_reason": finish}], "usage": None, "obfuscation": "x1", **extra}  # fmt: skip


def usage_chunk(prompt: int, completion: int, **extra: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-B9", "object": "chat.completion.chunk", "created": 1764777600, "model": "m",
            "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion, **extra}}  # fmt: skip


DONE = b"data: [DONE]\n\n"
AZURE_FILTER = {"hate": {"filtered": False, "severity": "safe"}, "self_harm": {"filtered": False, "severity": "safe"},
                "sexual": {"filtered": False, "severity": "safe"}, "violence": {"filtered": False, "severity": "safe"}}  # fmt: skip


def azure(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    filters = AZURE_FILTER if delta.get("content") else {}
    return {"choices": [{"content_filter_results": filters, "delta": delta, "finish_reason": finish, "index": 0,
            "logprobs": None}], "created": 1764777600, "id": "chatcmpl-AZ", "model": "gpt-4o-2024-11-20",
            "object": "chat.completion.chunk", "system_fingerprint": "fp_ee1d74bde0"}  # fmt: skip


def groq(delta: dict[str, Any], finish: str | None = None, x_groq: dict[str, Any] | None = None) -> dict[str, Any]:
    body = {"id": "chatcmpl-gq", "object": "chat.completion.chunk", "created": 1764777600,
            "model": "llama-3.3-70b-versatile", "system_fingerprint": "fp_3f3b593e33",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}  # fmt: skip
    return body | ({"x_groq": x_groq} if x_groq else {})


def plain(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    """vLLM, Cerebras, Ollama, llama.cpp, OpenRouter: no `usage: null` on every chunk."""
    return {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 1764777600, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}  # fmt: skip


def ollama(content: str, finish: str | None = None, **delta: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-602", "object": "chat.completion.chunk", "created": 1764777600, "model": "llama3.2",
            "system_fingerprint": "fp_ollama", "choices": [{"index": 0, "delta": {"role": "assistant",
            "content": content, **delta}, "finish_reason": finish}]}  # fmt: skip


def call(index: int, arguments: str, ident: str = "", name: str = "") -> dict[str, Any]:
    fragment: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if ident:
        fragment |= {"id": ident, "type": "function"}
        fragment["function"]["name"] = name
    return fragment


# (events, the exact items stream_chat yields)
# fmt: off
DIALECTS: dict[str, tuple[list[bytes], list[Item]]] = {
    "openai": (
        [sse(chunk({"role": "assistant", "content": "", "refusal": None})), sse(chunk({"content": "Hello"})),
         sse(chunk({"content": ", world."})), sse(chunk({}, "stop")),
         sse(usage_chunk(9, 3, prompt_tokens_details={"cached_tokens": 0})), DONE],
        ["Hello", ", world.", Usage(9, 3)],
    ),
    "openai_tool_calls": (
        [sse(chunk({"role": "assistant", "content": None, "tool_calls": [call(0, "", "call_A", "get_weather")],
                    "refusal": None})),
         sse(chunk({"tool_calls": [call(0, '{"ci')]})), sse(chunk({"tool_calls": [call(1, "", "call_B", "get_time")]})),
         sse(chunk({"tool_calls": [call(0, 'ty": "Zürich"}')]})), sse(chunk({"tool_calls": [call(1, '{"tz": "CET"}')]})),
         sse(chunk({}, "tool_calls")), sse(usage_chunk(80, 40)), DONE],
        [ToolCall("call_A", "get_weather", '{"city": "Zürich"}'), ToolCall("call_B", "get_time", '{"tz": "CET"}'),
         Usage(80, 40)],
    ),
    "azure": (
        [sse({"choices": [], "created": 0, "id": "", "model": "", "object": "", "prompt_filter_results":
              [{"prompt_index": 0, "content_filter_results": AZURE_FILTER}]}),
         sse(azure({"content": "", "refusal": None, "role": "assistant"})), sse(azure({"content": "Bonjour"})),
         sse(azure({"content": " à tous"})), sse(azure({}, "stop")), sse(usage_chunk(12, 4)), DONE],
        ["Bonjour", " à tous", Usage(12, 4)],
    ),
    "groq": (
        [sse(groq({"role": "assistant", "content": ""}, x_groq={"id": "req_01"})), sse(groq({"content": "Fast"})),
         sse(groq({"content": " answer"})),
         sse(groq({}, "stop", {"id": "req_01", "usage": {"queue_time": 0.02, "prompt_tokens": 40,
             "prompt_time": 0.002, "completion_tokens": 2, "completion_time": 0.004, "total_tokens": 42,
             "total_time": 0.006}})), DONE],
        ["Fast", " answer", Usage(40, 2)],
    ),
    "vllm_reasoning_content": (
        [sse(plain({"role": "assistant", "content": ""})), sse(plain({"reasoning_content": "Hmm, 2+2"})),
         sse(plain({"reasoning_content": " is 4."})), sse(plain({"content": "Four", "reasoning_content": None})),
         sse(plain({"content": "."})), sse(plain({"content": ""}, "stop", stop_reason=None)),
         sse(usage_chunk(20, 9)), DONE],
        [Thought("Hmm, 2+2"), Thought(" is 4."), "Four", ".", Usage(20, 9)],
    ),
    "cerebras_reasoning": (
        [sse(plain({"role": "assistant"})), sse(plain({"reasoning": "Think"})), sse(plain({"reasoning": "ing."})),
         sse(plain({"content": "Done"})),
         sse(plain({}, "stop", usage={"prompt_tokens": 15, "completion_tokens": 6, "total_tokens": 21},
                   time_info={"queue_time": 0.0001, "total_time": 0.01})), DONE],
        [Thought("Think"), Thought("ing."), "Done", Usage(15, 6)],
    ),
    "openrouter_comments_crlf": (
        [b": OPENROUTER PROCESSING\r\n\r\n", b": OPENROUTER PROCESSING\r\n\r\n",
         sse(plain({"role": "assistant", "content": "", "reasoning": None}), b"\r\n"),
         sse(plain({"role": "assistant", "content": "Ça va", "reasoning": None}), b"\r\n"),
         sse(plain({"role": "assistant", "content": " 🙂", "reasoning": None}), b"\r\n"),
         sse(plain({"role": "assistant", "content": ""}, "stop", native_finish_reason="stop"), b"\r\n"),
         sse(plain({"role": "assistant", "content": ""}, usage={"prompt_tokens": 7, "completion_tokens": 3,
             "total_tokens": 10, "cost": 0.0001}) | {"choices": []}, b"\r\n"),
         b"data: [DONE]\r\n\r\n"],
        ["Ça va", " 🙂", Usage(7, 3)],
    ),
    "ollama": (
        [sse(ollama("Hi")), sse(ollama(" there")), sse(ollama("", "stop")), DONE],
        ["Hi", " there"],
    ),
    "ollama_tool_call": (
        [sse(ollama("", tool_calls=[{"id": "call_x1", "index": 0, "type": "function", "function":
              {"name": "get_weather", "arguments": '{"city":"Paris"}'}}])), sse(ollama("", "tool_calls")), DONE],
        [ToolCall("call_x1", "get_weather", '{"city":"Paris"}')],
    ),
    "llama_cpp": (
        [sse(plain({"role": "assistant", "content": None})), b": ping - 2026-12-03 10:00:00\n\n",
         sse(plain({"content": "Two"})), sse(plain({"content": " plus two."})),
         sse(plain({}, "stop", usage={"completion_tokens": 4, "prompt_tokens": 11, "total_tokens": 15},
                   timings={"prompt_n": 11, "predicted_n": 4})), DONE],
        ["Two", " plus two.", Usage(11, 4)],
    ),
    "utf8_multibyte": (
        [sse(chunk({"content": "日本語"})), sse(chunk({"content": "é🙂ß"})), sse(chunk({}, "stop")), DONE],
        ["日本語", "é🙂ß"],
    ),
    "no_done_after_finish": (
        [sse(plain({"content": "Short"})), sse(plain({}, "stop"))],
        ["Short"],
    ),
    "finish_length": (
        [sse(chunk({"content": "Cut"})), sse(chunk({}, "length")), sse(usage_chunk(5, 1)), DONE],
        ["Cut", Usage(5, 1), Finish("length")],
    ),
}
# fmt: on


def tricky(body: bytes) -> list[bytes]:
    """Cut inside every "data:", between every \\r and \\n, before every UTF-8 continuation byte."""
    cuts = {i + 2 for i in range(len(body)) if body.startswith(b"data:", i)}
    cuts |= {i for i in range(1, len(body)) if body[i - 1 : i + 1] == b"\r\n" or 0x80 <= body[i] < 0xC0}
    edges = [0, *sorted(cuts), len(body)]
    return [body[a:b] for a, b in itertools.pairwise(edges) if b > a]


SHAPES: dict[str, tuple[str, Callable[[list[bytes]], list[bytes]]]] = {
    "chunked-events": ("chunked", lambda events: events),
    "chunked-tricky": ("chunked", lambda events: tricky(b"".join(events))),
    "chunked-bytes": ("chunked", lambda events: [bytes([b]) for b in b"".join(events)]),
    "close-tricky": ("close", lambda events: tricky(b"".join(events))),
    "length-tricky": ("length", lambda events: tricky(b"".join(events))),
}


class Server:
    """One response per connection: `writes` framed as `framing`, a drain after each;
    `cut` ends the connection without the body's end; `hang` holds it open, silent,
    until the client goes (after `writes`; None: before even the status line)."""

    def __init__(self, writes: list[bytes], framing: str = "chunked", *, status: int = 200,
                 cut: bool = False, hang: bool = False, silent: bool = False) -> None:  # fmt: skip
        self.writes, self.framing, self.status = writes, framing, status
        self.cut, self.hang, self.silent = cut, hang, silent
        self.handlers: set[asyncio.Task[None]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            if not self.silent:
                await self.respond(writer)
            if self.hang or self.silent:
                await reader.read()  # until the client closes the connection
        finally:
            writer.close()

    async def respond(self, writer: asyncio.StreamWriter) -> None:
        kind = "application/json" if self.status != 200 else "text/event-stream; charset=utf-8"
        head = f"HTTP/1.1 {self.status} X\r\ncontent-type: {kind}\r\ncache-control: no-cache\r\n"
        if self.framing == "chunked":
            head += "transfer-encoding: chunked\r\n"
        elif self.framing == "length":
            head += f"content-length: {sum(map(len, self.writes)) + (100 if self.cut else 0)}\r\n"
        else:
            head += "connection: close\r\n"
        writer.write(head.encode() + b"\r\n")
        await writer.drain()
        for piece in self.writes:
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if self.framing == "chunked" else piece)
            await writer.drain()
        if self.framing == "chunked" and not self.cut and not self.hang:
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async def run(self, items: list[Item], **endpoint: Any) -> list[Item]:
        server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        try:
            async for read in stream_chat(
                Endpoint(url, max_retries=0, **endpoint), "m", [{"role": "user", "content": "hi"}]
            ):
                items.extend(read)
            return items
        finally:
            server.close()
            for task in self.handlers:
                task.cancel()
            await asyncio.gather(*self.handlers, return_exceptions=True)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_dialect_is_read_exactly(backend: str, dialect: str, shape: str) -> None:
    events, expected = DIALECTS[dialect]
    framing, split = SHAPES[shape]
    assert await Server(split(events), framing).run([]) == expected


async def failure(server: Server, **endpoint: Any) -> tuple[str, list[Item]]:
    items: list[Item] = []
    with pytest.raises(LLMError) as err:
        await server.run(items, **endpoint)
    return err.value.kind, items


@pytest.mark.parametrize("shape", SHAPES)
async def test_stream_without_finish_reason_is_dropped(backend: str, shape: str) -> None:
    framing, split = SHAPES[shape]
    events = [sse(plain({"role": "assistant", "content": None})), sse(plain({"content": "Two"}))]
    assert await failure(Server(split([*events, DONE]), framing)) == ("dropped", ["Two"])
    assert await failure(Server(split(events), framing)) == ("dropped", ["Two"])


@pytest.mark.parametrize("shape", SHAPES)
async def test_error_event_mid_stream_is_a_server_error(backend: str, shape: str) -> None:
    framing, split = SHAPES[shape]
    # OpenRouter's shape: the error beside a choice whose finish_reason is "error".
    error = plain({"content": ""}, "error", error={"code": "server_error", "message": "Provider disconnected"})
    events = [sse(plain({"content": "Hal"})), sse(error), DONE]
    items: list[Item] = []
    with pytest.raises(LLMError, match="Provider disconnected") as err:
        await Server(split(events), framing).run(items)
    assert (err.value.kind, items) == ("server", ["Hal"])


@pytest.mark.parametrize("framing", ["chunked", "length"])
async def test_connection_cut_mid_body_is_dropped(backend: str, framing: str) -> None:
    events = [sse(chunk({"content": "Hal"})), b'data: {"id":"chatcmpl-B9","obj']
    assert await failure(Server(events, framing, cut=True)) == ("dropped", ["Hal"])


async def test_connection_cut_mid_event_without_framing_is_dropped(backend: str) -> None:
    # Connection: close is the body's only end: a cut looks like an end without finish_reason.
    events = [sse(chunk({"content": "Hal"})), b'data: {"id":"chatcmpl-B9","obj']
    assert await failure(Server(events, "close")) == ("dropped", ["Hal"])


@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
async def test_connection_reset_mid_body_is_dropped(backend: str, framing: str) -> None:
    # A reset mid-body: ClientPayloadError -> httpx2.ReadError under aiohttp (EOF with no
    # framing), ConnectionResetError -> httpx2.ReadError under httpx.
    server = Server([sse(chunk({"content": "Hal"}))], framing, cut=True)
    respond = server.respond

    async def reset(writer: asyncio.StreamWriter) -> None:
        await respond(writer)
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST, not FIN

    server.respond = reset  # type: ignore[method-assign]
    assert await failure(server) == ("dropped", ["Hal"])


@pytest.mark.parametrize("framing", ["chunked", "close"])
@pytest.mark.parametrize("said", [[], ["Hal"]])
async def test_silence_mid_reply_past_the_read_timeout_is_stalled(backend: str, framing: str, said: list[str]) -> None:
    events = [sse(chunk({"role": "assistant", "content": ""})), *(sse(chunk({"content": t})) for t in said)]
    assert await failure(Server(events, framing, hang=True), read_timeout_s=0.3) == ("stalled", said)


async def test_silence_before_the_status_line_is_a_timeout(backend: str) -> None:
    assert await failure(Server([], silent=True), read_timeout_s=0.3) == ("timeout", [])


async def test_refused_connection_is_connect(backend: str) -> None:
    # The SDK's aiohttp transport raises httpx2.ConnectTimeout for it (and for the next test's).
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: refused
        items: list[Item] = []
        with pytest.raises(LLMError) as err:
            async for read in stream_chat(Endpoint(f"http://127.0.0.1:{port}/v1", max_retries=0), "m", []):
                items.extend(read)
    assert (err.value.kind, items) == ("connect", [])


async def test_closed_before_the_status_line_is_connect(backend: str) -> None:
    server = Server([])
    server.respond = lambda writer: asyncio.sleep(0)  # type: ignore[method-assign]
    assert await failure(server) == ("connect", [])


@pytest.mark.parametrize(
    ("status", "error", "kind"),
    [
        (401, {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "invalid_api_key"}, "auth"),
        (429, {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}, "rate_limited"),
        (429, {"message": "You exceeded your current quota", "type": "insufficient_quota", "code": "insufficient_quota"}, "quota"),
        (500, {"message": "The server had an error", "type": "server_error", "code": None}, "server"),
    ],
)  # fmt: skip
async def test_status_errors(backend: str, status: int, error: dict[str, Any], kind: str) -> None:
    body = json.dumps({"error": error}).encode()
    assert await failure(Server([body], "length", status=status)) == (kind, [])
