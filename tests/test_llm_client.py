"""The streaming client against the exact byte shapes real servers send (llama.cpp's
role-only first chunk, `: ping` comments, [DONE] with and without a finish_reason)."""

from __future__ import annotations

import asyncio
import gzip as gzip_module
import json
from collections.abc import AsyncIterator

import httpx2
import pytest

from collab.llm import Endpoint, Item, LLMError, stream_chat
from collab.llm.client import _aiohttp_body, aclose_clients, client_for


def chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
    body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return b"data: " + json.dumps(body).encode() + b"\n\n"


LLAMA_OK = [
    chunk({"role": "assistant"}),
    b": ping - 2026-12-02 10:00:00\n\n",
    chunk({"content": "Two"}),
    chunk({"content": " plus two is four."}),
    chunk({}, "stop"),
    b"data: [DONE]\n\n",
]
LLAMA_INTERRUPTED = [chunk({"role": "assistant"}), chunk({"content": "Two"}), b"data: [DONE]\n\n"]


async def serve(events: list[bytes], *, together: bool = False, gzip: bool = False) -> tuple[asyncio.Server, str]:
    """A server that sends `events` as HTTP chunks, a drain after each; `together`: all
    of them in one chunk, so that the client reads them at once; `gzip`: the body
    compressed (`content-encoding: gzip`), cut into chunks across the events' bounds."""
    if together:
        events = [b"".join(events)]
    encoding = b""
    if gzip:
        packed = gzip_module.compress(b"".join(events))
        events = [packed[i : i + 7] for i in range(0, len(packed), 7)]
        encoding = b"content-encoding: gzip\r\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n" + encoding + b"transfer-encoding: chunked\r\n\r\n"
        )
        for event in events:
            writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1"


@pytest.fixture
async def cleanup() -> AsyncIterator[None]:
    yield
    await aclose_clients()


async def run(
    events: list[bytes], items: list[Item] | None = None, *, together: bool = False, gzip: bool = False
) -> list[Item]:
    """What stream_chat yields; `items` keeps what came before a failure."""
    items = [] if items is None else items
    server, url = await serve(events, together=together, gzip=gzip)
    try:
        async with server:
            async for read in stream_chat(Endpoint(url, max_retries=0), "m", [{"role": "user", "content": "hi"}]):
                items.extend(read)
            return items
    finally:
        server.close()


@pytest.mark.usefixtures("cleanup")
async def test_llama_cpp_stream_is_read_whole() -> None:
    assert await run(LLAMA_OK) == ["Two", " plus two is four."]


@pytest.mark.usefixtures("cleanup")
async def test_the_events_of_one_read_come_in_one_list() -> None:
    # A loaded process reads several events at once: what they hold is handed on in one
    # step of the stream (and of its readers), each text piece still one chunk; the
    # events that hold nothing (the role, a comment, the finish, [DONE]) add no list.
    server, url = await serve(LLAMA_OK, together=True)
    reads = []
    async with server:
        async for read in stream_chat(Endpoint(url, max_retries=0), "m", [{"role": "user", "content": "hi"}]):
            reads.append(read)
    assert reads == [["Two", " plus two is four."]]


@pytest.mark.usefixtures("cleanup")
async def test_done_without_finish_reason_is_a_dropped_stream() -> None:
    with pytest.raises(LLMError) as err:
        await run(LLAMA_INTERRUPTED)
    assert err.value.kind == "dropped"


@pytest.mark.parametrize("together", [False, True], ids=["apart", "one-read"])
@pytest.mark.usefixtures("cleanup")
async def test_error_event_mid_stream_is_reported_after_the_text_before_it(together: bool) -> None:
    events = [chunk({"content": "Hi"}), chunk({"content": " there"}), b'data: {"error": {"message": "overloaded"}}\n\n']
    items: list[Item] = []
    with pytest.raises(LLMError, match="overloaded"):
        await run(events, items, together=together)
    assert items == ["Hi", " there"]  # the reply keeps what came before the failure


@pytest.mark.parametrize("bad", [b"data: {not json\n\n", b"data: 5\n\n"], ids=["not-json", "no-chunk-object"])
@pytest.mark.usefixtures("cleanup")
async def test_a_malformed_chunk_fails_after_the_text_before_it(bad: bytes) -> None:
    items: list[Item] = []
    with pytest.raises(LLMError, match="malformed") as err:
        await run([chunk({"content": "Hi"}), bad], items, together=True)
    assert (err.value.kind, items) == ("server", ["Hi"])


@pytest.mark.usefixtures("cleanup")
@pytest.mark.parametrize(("gzip", "direct"), [(False, True), (True, False)], ids=["plain", "gzip"])
async def test_the_body_is_read_below_httpx_unless_it_is_compressed(
    gzip: bool, direct: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK's aiohttp transport as shipped: its plain body is read from aiohttp itself
    # (client._aiohttp_body); a compressed one through httpx, which decodes it.
    monkeypatch.setenv("COLLAB_LLM_HTTP", "aiohttp")
    server, url = await serve(LLAMA_OK, gzip=gzip)
    async with server:
        client = client_for(Endpoint(url, max_retries=0))
        response = await client.post(
            "/chat/completions",
            body={"model": "m", "messages": [], "stream": True},
            cast_to=httpx2.Response,
            stream=True,
        )
        try:
            assert (_aiohttp_body(response) is not None) is direct
        finally:
            await response.aclose()


@pytest.mark.usefixtures("cleanup")
async def test_a_compressed_stream_is_read_whole() -> None:
    assert await run(LLAMA_OK, gzip=True) == ["Two", " plus two is four."]
