"""The simulated model, seen through the real ``openai.AsyncOpenAI`` client.

Two ways in:

- in-process: ``httpx2.ASGITransport`` straight into the ASGI app. Fast, but that
  transport buffers the whole response before handing it over (it collects every
  body message and yields one joined chunk), so it checks content, not timing, and
  it cannot do stall/drop (it needs the app to finish the response).
- over a real loopback port with ``running_simulator`` (uvicorn in a thread): timing,
  stalls, drops, disconnects.

No test sleeps to wait for something: they wait for the condition itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from collab.simulator.app import SimulatorApp, make_app
from collab.simulator.cli import add_arguments, config_from_options
from collab.simulator.config import ModelSpec, SimConfig, parse_model
from collab.simulator.testing import running_simulator, running_simulator_app
from collab.simulator.text import (
    count_prompt_tokens,
    expected_text,
    expected_tokens,
    simulated_tokens,
    thinking_tokens,
)
from collab.simulator.timing import Schedule, token_offset

REPO = Path(__file__).resolve().parents[1]
MSGS: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Explain how token streaming works, with an example."},
]


# ------------------------------------------------------------------ helpers


@contextlib.asynccontextmanager
async def asgi_client(app: SimulatorApp, **kwargs: Any) -> AsyncIterator[openai.AsyncOpenAI]:
    kwargs.setdefault("max_retries", 0)
    kwargs.setdefault("api_key", "test-key")
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app))
    async with openai.AsyncOpenAI(base_url="http://sim.test/v1", http_client=http, **kwargs) as client:
        yield client


@contextlib.asynccontextmanager
async def port_client(base_url: str, **kwargs: Any) -> AsyncIterator[openai.AsyncOpenAI]:
    kwargs.setdefault("max_retries", 0)
    kwargs.setdefault("api_key", "test-key")
    async with openai.AsyncOpenAI(base_url=base_url, **kwargs) as client:
        yield client


async def stream_chunks(client: openai.AsyncOpenAI, **kwargs: Any) -> list[Any]:
    kwargs.setdefault("model", "sim")
    kwargs.setdefault("messages", MSGS)
    stream = await client.chat.completions.create(stream=True, **kwargs)
    return [chunk async for chunk in stream]


def contents(chunks: list[Any]) -> list[str]:
    return [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]


async def wait_for(condition: Callable[[], bool], within: float = 10.0) -> None:
    """Poll ``condition`` until it holds (fails the test after ``within`` seconds)."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def logged(*names: str) -> Iterator[list[logging.LogRecord]]:
    """Collect WARNING+ records of these loggers, whatever the logging config."""
    handler = _Records()
    handler.setLevel(logging.WARNING)
    loggers = [logging.getLogger(n) for n in names]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[str, SimulatorApp]]:
    """One real server for the over-the-port fault tests (fast tokens)."""
    with running_simulator_app(tps=400, ttft_ms=10, reply_tokens=40, seed=5) as (url, app):
        yield url, app


# --------------------------------------------------------------- pure text


def test_simulated_tokens_exact_length_and_nonempty() -> None:
    for n in (1, 2, 3, 5, 11, 12, 13, 17, 40, 120, 500):
        tokens = simulated_tokens(MSGS, 0, "sim", n)
        assert len(tokens) == n
        assert all(isinstance(t, str) and t for t in tokens)


def test_simulated_tokens_deterministic_and_seeded() -> None:
    a = simulated_tokens(MSGS, 1, "sim", 120)
    assert a == simulated_tokens([dict(m) for m in MSGS], 1, "sim", 120)
    assert a != simulated_tokens(MSGS, 2, "sim", 120)
    assert a != simulated_tokens(MSGS, 1, "gpt-4o-mini", 120)
    assert a != simulated_tokens([*MSGS, {"role": "user", "content": "more"}], 1, "sim", 120)
    # A fault suffix does not change the text: faulty variants stream a prefix of it.
    assert a == simulated_tokens(MSGS, 1, "sim+drop@3", 120)


def test_text_looks_like_model_output() -> None:
    texts = [expected_text([{"role": "user", "content": f"q{i}"}], 0, "sim", 200) for i in range(30)]
    joined = "\n".join(texts)
    assert "```python\n" in joined
    assert "\n- " in joined or "\n1. " in joined
    assert "\n\n" in joined
    assert any(t.startswith(" ") for t in simulated_tokens(MSGS, 0, "sim", 50)[1:])
    for text in texts:
        assert text.count("```") % 2 == 0  # code fences always closed


def test_expected_text_truncation_is_a_prefix() -> None:
    full = expected_tokens(MSGS, 3, "sim", 120)
    assert expected_tokens(MSGS, 3, "sim", 120, max_tokens=7) == full[:7]
    assert expected_text(MSGS, 3, "sim", 120, max_tokens=500) == "".join(full)


def test_count_prompt_tokens() -> None:
    assert count_prompt_tokens([{"role": "user", "content": "hello world"}]) == 3 + 4 + 2
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello world"}]}]
    assert count_prompt_tokens(parts) == 3 + 4 + 2


def test_parse_model() -> None:
    assert parse_model("sim") == ModelSpec("sim")
    assert parse_model("gpt-4o") == ModelSpec("gpt-4o")
    assert parse_model("sim+429").fault == "429"
    assert parse_model("sim+quota").fault == "quota"
    assert parse_model("sim+500").fault == "500"
    assert parse_model("sim+stall@7") == ModelSpec("sim", "stall", 7)
    assert parse_model("sim+drop@0") == ModelSpec("sim", "drop", 0)
    assert parse_model("sim+stall") == ModelSpec("sim", "stall", None)
    assert parse_model("sim+slow+drop@3") == ModelSpec("sim", "drop", 3, slow=True)
    for bad in ("sim+", "sim+nope", "sim+429@3", "sim+drop@x", "sim+drop@-1", "+429", "sim+429+500"):
        with pytest.raises(ValueError):
            parse_model(bad)


def test_schedule_due_counts_do_not_drift() -> None:
    schedule = Schedule(first=1000.0, tps=750.0)
    assert schedule.due(999.9, 10**9) == 0
    for i in (0, 1, 2, 749, 750, 12345, 10**6):
        at = 1000.0 + i / 750.0
        assert schedule.write_time(i) == at
        assert schedule.due(at, 10**9) == i + 1
        assert schedule.due(at - 1e-4, 10**9) == i
    assert schedule.due(5000.0, 10) == 10


def test_token_offset_with_and_without_tick() -> None:
    assert token_offset(0, 750, ttft_ms=200) == 0.2
    assert token_offset(3, 100, ttft_ms=0) == pytest.approx(0.03)
    # 10 ms tick at 750 tokens/s: tokens 0..7 due within the first 10 ms.
    assert token_offset(0, 750, 0, tick_ms=10) == 0
    assert token_offset(1, 750, 0, tick_ms=10) == pytest.approx(0.01)
    assert token_offset(7, 750, 0, tick_ms=10) == pytest.approx(0.01)
    assert token_offset(8, 750, 0, tick_ms=10) == pytest.approx(0.02)
    assert token_offset(75, 750, 0, tick_ms=10) == pytest.approx(0.1)  # exactly on a tick: not pushed
    schedule = Schedule(first=50.0, tps=750.0, tick=0.01)
    for i in range(200):
        assert schedule.write_time(i) == pytest.approx(50.0 + token_offset(i, 750, 0, 10))
        assert schedule.write_time(i) >= 50.0 + i / 750.0 - 1e-9


def test_a_tick_served_late_sends_only_what_its_tick_had_due() -> None:
    """Under load the loop wakes for the 150 ms tick at 156 ms: token 31 (due at 155 ms) is
    the 200 ms tick's, never sent early (test_tick_batches_due_tokens_into_fewer_writes saw it)."""
    schedule = Schedule(first=0.0, tps=200.0, tick=0.05)
    assert schedule.due(0.156, 40) == 31 and schedule.write_time(31) == pytest.approx(0.2)
    assert schedule.due(0.2, 40) == 40 and schedule.due(0.01, 40) == 1
    assert Schedule(first=0.0, tps=200.0).due(0.156, 40) == 32  # no tick: every token at its due time


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        SimConfig(tps=0)
    with pytest.raises(ValueError):
        SimConfig(fault_rate=1.5)
    with pytest.raises(ValueError):
        SimConfig(fault="boom")  # type: ignore[arg-type]


def test_cli_options_to_config() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options = vars(
        parser.parse_args(
            [
                *("--host", "0.0.0.0", "--port", "9", "--tps", "750", "--ttft-ms", "20", "--seed", "4"),
                *("--fault", "drop", "--fault-after", "3", "--fault-rate", "0.5", "--api-key", "k"),
                *("--reply-tokens", "10", "--tick-ms", "2"),
            ]
        )
    )
    config = config_from_options(options)
    assert (options["host"], options["port"]) == ("0.0.0.0", 9)
    assert config == SimConfig(
        tps=750,
        ttft_ms=20,
        seed=4,
        fault="drop",
        fault_after=3,
        fault_rate=0.5,
        api_key="k",
        reply_tokens=10,
        tick_ms=2,
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["--fault", "boom"])


# ------------------------------------------------------- in-process (ASGI)


async def test_stream_matches_expected_tokens_and_chunk_shape() -> None:
    app = make_app(tps=5000, ttft_ms=0, seed=9, reply_tokens=80)
    async with asgi_client(app) as client:
        chunks = await stream_chunks(client)
    assert contents(chunks) == expected_tokens(MSGS, 9, "sim", 80)  # one token per chunk
    first, last = chunks[0], chunks[-1]
    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].delta.content == ""
    assert all(c.choices[0].delta.role is None for c in chunks[1:])
    assert last.choices[0].finish_reason == "stop"
    assert last.choices[0].delta.content is None
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert {c.id for c in chunks} == {first.id} and first.id.startswith("chatcmpl-")
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert {c.model for c in chunks} == {"sim"}
    assert all(c.usage is None for c in chunks)


async def test_stream_deterministic_per_seed_and_model() -> None:
    async def text(seed: int, model: str = "sim") -> str:
        async with asgi_client(make_app(tps=10000, ttft_ms=0, seed=seed)) as client:
            return "".join(contents(await stream_chunks(client, model=model)))

    a = await text(1)
    assert a == await text(1) == expected_text(MSGS, 1)
    assert a != await text(2)
    other = await text(1, "my-assistant-model")
    assert other == expected_text(MSGS, 1, "my-assistant-model") != a


async def test_max_tokens_truncates_with_length() -> None:
    app = make_app(tps=10000, ttft_ms=0, reply_tokens=60)
    async with asgi_client(app) as client:
        chunks = await stream_chunks(client, max_tokens=7)
        assert contents(chunks) == expected_tokens(MSGS, 0, "sim", 60)[:7]
        assert chunks[-1].choices[0].finish_reason == "length"
        chunks = await stream_chunks(client, max_completion_tokens=5, stream_options={"include_usage": True})
        assert len(contents(chunks)) == 5
        assert chunks[-2].choices[0].finish_reason == "length"
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
        # A limit above the reply length changes nothing.
        chunks = await stream_chunks(client, max_tokens=1000)
        assert len(contents(chunks)) == 60 and chunks[-1].choices[0].finish_reason == "stop"


def test_parse_model_reasoning() -> None:
    assert parse_model("sim+think@12") == ModelSpec("sim", think=12)
    assert parse_model("sim+reasoning@3") == ModelSpec("sim", think=3, think_field="reasoning")
    assert parse_model("sim+slow+think@2+stall@5") == ModelSpec("sim", "stall", 5, slow=True, think=2)
    for bad in ("sim+think", "sim+think@", "sim+reasoning@x", "sim+think@-1"):
        with pytest.raises(ValueError):
            parse_model(bad)


@pytest.mark.parametrize(("model", "field"), [("sim+think@6", "reasoning_content"), ("sim+reasoning@6", "reasoning")])
async def test_reasoning_streams_first_in_its_own_field(model: str, field: str) -> None:
    app = make_app(tps=10000, ttft_ms=0, reply_tokens=20, seed=3)
    async with asgi_client(app) as client:
        chunks = await stream_chunks(client, model=model, stream_options={"include_usage": True})
        short = await stream_chunks(client, model=model, max_tokens=8)
        whole = await client.chat.completions.create(model=model, messages=MSGS)
    thoughts = [getattr(c.choices[0].delta, field) for c in chunks if c.choices and c.choices[0].delta.model_extra]
    assert [t for t in thoughts if t] == thinking_tokens(MSGS, 3, model, 6)
    assert contents(chunks) == expected_tokens(MSGS, 3, model, 20)  # the answer is the plain model's
    first_answer = next(i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.content)
    assert all(not getattr(c.choices[0].delta, field, None) for c in chunks[first_answer:] if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6 + 20
    # max_tokens counts the reasoning: 6 of it, 2 of the answer, cut off.
    assert len(contents(short)) == 2 and short[-1].choices[0].finish_reason == "length"
    assert (whole.choices[0].message.model_extra or {})[field] == "".join(thinking_tokens(MSGS, 3, model, 6))
    assert whole.choices[0].message.content == expected_text(MSGS, 3, model, 20)


async def test_include_usage_last_chunk() -> None:
    app = make_app(tps=10000, ttft_ms=0, reply_tokens=30)
    async with asgi_client(app) as client:
        chunks = await stream_chunks(client, stream_options={"include_usage": True})
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 30
    assert usage_chunk.usage.prompt_tokens == count_prompt_tokens(MSGS)
    assert usage_chunk.usage.total_tokens == 30 + count_prompt_tokens(MSGS)
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks[:-1])


async def test_non_streaming_completion() -> None:
    app = make_app(tps=10000, ttft_ms=0, reply_tokens=50, seed=2)
    async with asgi_client(app) as client:
        raw = await client.chat.completions.with_raw_response.create(model="sim", messages=MSGS)
        reply = raw.parse()
        short = await client.chat.completions.create(model="sim", messages=MSGS, max_tokens=4)
    assert raw.headers["x-sim-tps"] == "10000"
    assert float(raw.headers["x-sim-start"]) > 1e9
    assert reply.object == "chat.completion"
    assert reply.model == "sim"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == expected_text(MSGS, 2, "sim", 50)
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 50
    assert reply.usage.total_tokens == 50 + reply.usage.prompt_tokens
    assert short.choices[0].message.content == expected_text(MSGS, 2, "sim", 50, max_tokens=4)
    assert short.choices[0].finish_reason == "length"


async def test_models_endpoint() -> None:
    async with asgi_client(make_app()) as client:
        models = await client.models.list()
        assert "sim" in [m.id for m in models.data]
        assert (await client.models.retrieve("sim+drop@3")).id == "sim+drop@3"
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("sim+bogus")


async def test_rate_limit_429() -> None:
    async with asgi_client(make_app()) as client:
        with pytest.raises(openai.RateLimitError) as info:
            await client.chat.completions.create(model="sim+429", messages=MSGS, stream=True)
    err = info.value
    assert err.status_code == 429
    assert err.response.headers["retry-after"] == "1"
    assert err.code == "rate_limit_exceeded"
    assert err.type == "rate_limit_exceeded"
    assert isinstance(err.body, dict) and err.body["message"]


async def test_rate_limit_is_retried_by_the_sdk() -> None:
    app = make_app(fault="429", fault_rate=1.0)
    async with asgi_client(app, max_retries=1) as client:
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="sim", messages=MSGS)
    assert app.stats.requests == 2  # first try + one retry after Retry-After: 1


async def test_insufficient_quota() -> None:
    async with asgi_client(make_app()) as client:
        with pytest.raises(openai.RateLimitError) as info:
            await client.chat.completions.create(model="sim+quota", messages=MSGS)
    assert info.value.code == "insufficient_quota"
    assert info.value.type == "insufficient_quota"
    assert "retry-after" not in info.value.response.headers


async def test_server_error_500() -> None:
    async with asgi_client(make_app()) as client:
        with pytest.raises(openai.InternalServerError) as info:
            await client.chat.completions.create(model="sim+500", messages=MSGS, stream=True)
    assert info.value.status_code == 500
    assert info.value.type == "server_error"


async def test_cli_fault_rate_is_deterministic() -> None:
    async def pattern(seed: int) -> list[bool]:
        app = make_app(tps=10000, ttft_ms=0, reply_tokens=3, seed=seed, fault="500", fault_rate=0.5)
        hits = []
        async with asgi_client(app) as client:
            for _ in range(24):
                try:
                    await client.chat.completions.create(model="sim", messages=MSGS)
                    hits.append(False)
                except openai.InternalServerError:
                    hits.append(True)
        return hits

    a = await pattern(1)
    assert a == await pattern(1)
    assert 0 < sum(a) < 24
    assert a != await pattern(2)


async def test_model_fault_overrides_cli_fault() -> None:
    app = make_app(tps=10000, ttft_ms=0, fault="500")
    async with asgi_client(app) as client:
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="sim", messages=MSGS)
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="sim+429", messages=MSGS)


async def test_api_key_required() -> None:
    app = make_app(tps=10000, ttft_ms=0, reply_tokens=3, api_key="sekret")
    async with asgi_client(app, api_key="wrong") as client:
        with pytest.raises(openai.AuthenticationError) as info:
            await client.chat.completions.create(model="sim", messages=MSGS)
        assert info.value.status_code == 401
        assert info.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()
    async with asgi_client(app, api_key="sekret") as client:
        reply = await client.chat.completions.create(model="sim", messages=MSGS)
        assert reply.choices[0].message.content


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"model": "sim"}', "messages"),
        (b'{"model": "sim", "messages": []}', "messages"),
        (b'{"model": "sim", "messages": "hi"}', "messages"),
        (b'{"model": "sim", "messages": [{"content": "no role"}]}', "messages[0]"),
        (b'{"model": "sim", "messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "sim", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
        (b'{"model": "sim", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "max_tokens"),
        (
            b'{"model": "sim", "messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}',
            "max_tokens",
        ),
        (b'{"model": "sim+explode", "messages": [{"role": "user", "content": "x"}]}', "model"),
    ],
)
async def test_bad_requests_are_400(body: bytes, param: str | None) -> None:
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=make_app())) as http:
        response = await http.post(
            "http://sim.test/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param


async def test_unknown_fault_through_the_sdk_is_bad_request() -> None:
    async with asgi_client(make_app()) as client:
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="sim+nope", messages=MSGS)
        # Any plain model name is served.
        reply = await client.chat.completions.create(model="claude-whatever", messages=MSGS, max_tokens=2)
        assert reply.choices[0].message.content == expected_text(MSGS, 0, "claude-whatever", max_tokens=2)


async def test_unknown_path_method_and_size_limits() -> None:
    app = make_app(max_body_bytes=1000)
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://sim.test") as http:
        response = await http.get("/v1/nothing")
        assert response.status_code == 404 and "error" in response.json()
        assert (await http.get("/v1/chat/completions")).status_code == 405
        big = json.dumps({"model": "sim", "messages": [{"role": "user", "content": "x" * 2000}]})
        response = await http.post("/v1/chat/completions", content=big)
        assert response.status_code == 413 and "error" in response.json()

        async def chunked() -> AsyncIterator[bytes]:  # no content-length: the running count trips
            for _ in range(5):
                yield b" " * 300

        assert (await http.post("/v1/chat/completions", content=chunked())).status_code == 413


def _png(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), "red").save(out, "PNG")
    return out.getvalue()


async def test_image_parts_and_documents_get_a_proof_line_and_are_recorded_without_bytes() -> None:
    import base64

    png = _png(64, 48)
    doc = "[file a.txt: text/plain, 1 page, whole]\nOne two three four five six seven\n[end of file a.txt]"
    parts: list[Any] = [
        {"type": "text", "text": "alice: both\n\n" + doc},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}},
        {"type": "image_url", "image_url": {"url": "https://chat.example.org/files/s/t0k"}},
    ]
    messages: list[Any] = [{"role": "user", "content": parts}]
    proof = (
        f"Received 2 images: image/png {len(png)} bytes 64x48; url https://chat.example.org/files/s/t0k. "
        'Documents: a.txt "One two three four five six…".'
    )
    with running_simulator_app(tps=5000, ttft_ms=0, reply_tokens=5) as (url, app):
        async with contextlib.AsyncExitStack() as stack:
            client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
            stack.push_async_callback(client.close)
            reply = await client.chat.completions.create(model="sim", messages=messages)
            streamed = await client.chat.completions.create(model="sim", messages=messages, stream=True)
            pieces = [c.choices[0].delta.content async for c in streamed if c.choices and c.choices[0].delta.content]
            with pytest.raises(openai.BadRequestError, match="not valid base64"):
                bad = [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,%%"}}],
                    }
                ]
                await client.chat.completions.create(model="sim", messages=bad)
    text = reply.choices[0].message.content or ""
    assert text == proof + "\n\n" + expected_text(messages, 0, "sim", 5) == "".join(pieces)
    assert reply.usage is not None and reply.usage.prompt_tokens == count_prompt_tokens(messages)
    recorded = app.recorded[0]
    assert recorded["images"][0] == {"media_type": "image/png", "size": len(png), "width": 64, "height": 48, "url": ""}
    assert recorded["messages"][0]["content"][1]["image_url"]["url"] == f"data:image/png;base64,<{len(png)} bytes>"
    assert base64.b64encode(png).decode() not in str(app.recorded)


# ------------------------------------------------------- over a real port


async def test_pacing_follows_tps_and_ttft() -> None:
    tps, ttft_ms, n = 100.0, 150.0, 30
    with running_simulator(tps=tps, ttft_ms=ttft_ms, reply_tokens=n, seed=3) as url:
        async with port_client(url) as client:
            t_request = time.time()
            stream = await client.chat.completions.create(model="sim", messages=MSGS, stream=True)
            headers = stream.response.headers
            arrivals: list[tuple[float, str]] = []
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    arrivals.append((time.time(), chunk.choices[0].delta.content))
    start = float(headers["x-sim-start"])
    assert float(headers["x-sim-tps"]) == tps
    assert float(headers["x-sim-ttft-ms"]) == ttft_ms
    assert int(headers["x-sim-tokens"]) == n
    assert [t for _, t in arrivals] == expected_tokens(MSGS, 3, "sim", n)
    assert start >= t_request - 0.01
    # No token ever arrives before its scheduled emission time...
    for i, (arrived, _) in enumerate(arrivals):
        assert arrived >= start + ttft_ms / 1000 + i / tps - 0.005, i
    # ...so the stream takes at least about ttft + (n - 1) / tps.
    assert arrivals[-1][0] - t_request >= 0.8 * (ttft_ms / 1000 + (n - 1) / tps)


async def test_tick_batches_due_tokens_into_fewer_writes() -> None:
    tps, n = 200.0, 40
    with running_simulator_app(tps=tps, ttft_ms=0, reply_tokens=n, tick_ms=50) as (url, app):
        async with port_client(url) as client:
            stream = await client.chat.completions.create(model="sim", messages=MSGS, stream=True)
            start = float(stream.response.headers["x-sim-start"])
            assert stream.response.headers["x-sim-tick-ms"] == "50"
            arrivals = [time.time() async for chunk in stream if chunk.choices and chunk.choices[0].delta.content]
        assert len(arrivals) == n
        for i, arrived in enumerate(arrivals):
            # Held until the stream's next 50 ms tick, never sent early.
            assert arrived >= start + token_offset(i, tps, 0, 50) - 0.005, i
        assert app.stats.content_chunks == n
        assert app.stats.writes < n / 2  # ~ (n / tps) / tick + 1 writes, several tokens each


async def test_raw_sse_wire_format(live: tuple[str, SimulatorApp]) -> None:
    url, _ = live
    body = {"model": "sim", "messages": MSGS, "stream": True, "stream_options": {"include_usage": True}}
    async with (
        httpx2.AsyncClient() as http,
        http.stream("POST", f"{url}/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["transfer-encoding"] == "chunked"
        for name in ("x-sim-start", "x-sim-tps", "x-sim-ttft-ms"):
            assert name in response.headers
        raw = b"".join([part async for part in response.aiter_bytes()]).decode()
    assert raw.endswith("\n\ndata: [DONE]\n\n")
    events = raw.split("\n\n")
    assert events[-1] == ""
    assert all(e.startswith("data: ") for e in events[:-1])
    payloads = [json.loads(e[len("data: ") :]) for e in events[:-2]]
    assert len(payloads) == 1 + 40 + 1 + 1  # role, tokens, finish, usage
    assert set(payloads[1]) == {"id", "object", "created", "model", "system_fingerprint", "choices", "usage"}
    assert payloads[1]["choices"] == [
        {
            "index": 0,
            "delta": {"content": expected_tokens(MSGS, 5, "sim", 40)[0]},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"]["completion_tokens"] == 40


async def test_drop_mid_stream_raises_connection_error(live: tuple[str, SimulatorApp]) -> None:
    url, app = live
    received: list[str] = []
    with logged("uvicorn", "uvicorn.error", "asyncio") as records:
        async with port_client(url) as client:
            stream = await client.chat.completions.create(model="sim+drop@6", messages=MSGS, stream=True)
            with pytest.raises(openai.APIConnectionError) as info:
                async for chunk in stream:
                    received.extend(contents([chunk]))
    # The SDK wraps httpx2's error: a broken chunked body, not a timeout.
    assert type(info.value) is openai.APIConnectionError
    assert isinstance(info.value.__cause__, httpx2.RemoteProtocolError)
    assert "incomplete chunked read" in str(info.value.__cause__)
    assert received == expected_tokens(MSGS, 5, "sim", 40)[:6]
    assert records == []  # the deliberate drop is not logged as a server error
    await wait_for(lambda: app.active_requests == 0)


async def test_drop_at_zero_and_non_streaming_drop(live: tuple[str, SimulatorApp]) -> None:
    url, _ = live
    async with port_client(url) as client:
        stream = await client.chat.completions.create(model="sim+drop@0", messages=MSGS, stream=True)
        with pytest.raises(openai.APIConnectionError):
            async for chunk in stream:
                assert chunk.choices[0].delta.role == "assistant"
        with pytest.raises(openai.APIConnectionError) as info:
            await client.chat.completions.create(model="sim+drop@2", messages=MSGS)
        assert isinstance(info.value.__cause__, httpx2.RemoteProtocolError)


async def test_stall_times_out_and_server_lets_go(live: tuple[str, SimulatorApp]) -> None:
    url, app = live
    received: list[str] = []
    with logged("uvicorn", "uvicorn.error", "asyncio") as records:
        async with port_client(url, timeout=httpx2.Timeout(5, read=0.5)) as client:
            stream = await client.chat.completions.create(model="sim+stall@4", messages=MSGS, stream=True)
            with pytest.raises(openai.APITimeoutError) as info:
                async for chunk in stream:
                    received.extend(contents([chunk]))
        assert isinstance(info.value.__cause__, httpx2.ReadTimeout)
        assert received == expected_tokens(MSGS, 5, "sim", 40)[:4]
        # The client closed the connection: the stalled request ends on the server too.
        await wait_for(lambda: app.active_requests == 0)
    assert records == []


async def test_stall_does_not_block_other_streams(live: tuple[str, SimulatorApp]) -> None:
    url, app = live
    async with port_client(url, timeout=httpx2.Timeout(30)) as client:
        stalled = await client.chat.completions.create(model="sim+stall@1", messages=MSGS, stream=True)
        first = await stalled.__anext__()
        assert first.choices[0].delta.role == "assistant"
        chunks = await stream_chunks(client)
        assert contents(chunks) == expected_tokens(MSGS, 5, "sim", 40)
        await stalled.close()
    await wait_for(lambda: app.active_requests == 0)


async def test_non_streaming_stall_times_out(live: tuple[str, SimulatorApp]) -> None:
    url, app = live
    async with port_client(url, timeout=httpx2.Timeout(5, read=0.5)) as client:
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(model="sim+stall@2", messages=MSGS)
    await wait_for(lambda: app.active_requests == 0)


async def test_client_disconnect_mid_stream_is_clean() -> None:
    with (
        logged("uvicorn", "uvicorn.error", "asyncio") as records,
        running_simulator_app(tps=50, ttft_ms=0, reply_tokens=1000) as (url, app),
    ):
        async with port_client(url) as client:
            stream = await client.chat.completions.create(model="sim", messages=MSGS, stream=True)
            got = 0
            async for chunk in stream:
                got += len(contents([chunk]))
                if got >= 3:
                    break
            await stream.close()
            await wait_for(lambda: app.active_requests == 0)
        assert app.stats.disconnects >= 1
        assert app.stats.content_chunks < 100  # it stopped generating
    assert records == []


async def test_shutdown_ends_stalled_streams() -> None:
    with running_simulator_app(tps=1000, ttft_ms=0, reply_tokens=20) as (url, app):
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=httpx2.Timeout(30))
        stream = await client.chat.completions.create(model="sim+stall@2", messages=MSGS, stream=True)
        await stream.__anext__()
        await wait_for(lambda: app.active_requests == 1)
    # Leaving the block stopped the server although a stream was stalled; the client sees a cut.
    with pytest.raises(openai.APIConnectionError):
        async for _ in stream:
            pass
    await client.close()


async def test_api_key_over_port() -> None:
    with running_simulator(tps=1000, ttft_ms=0, reply_tokens=5, api_key="k1") as url:
        async with port_client(url, api_key="nope") as client:
            with pytest.raises(openai.AuthenticationError):
                await stream_chunks(client)
        async with port_client(url, api_key="k1") as client:
            assert len(contents(await stream_chunks(client))) == 5


def test_running_simulator_from_sync_code() -> None:
    with running_simulator(ttft_ms=0, tps=1000) as url:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", url)
        response = httpx2.get(f"{url}/models")
        assert response.json()["data"][0]["id"] == "sim"


# ------------------------------------------------------------------- CLI


def _start(cmd: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()  # printed once the port is bound and listening
    return proc, line


@pytest.mark.parametrize(
    ("cmd", "sig"),
    [
        ([sys.executable, "-m", "collab.simulator"], signal.SIGINT),
        ([sys.executable, "manage.py", "simulate_model"], signal.SIGTERM),
    ],
    ids=["python-m-sigint", "manage-py-sigterm"],
)
def test_command_line_serves_and_stops_cleanly(cmd: list[str], sig: signal.Signals) -> None:
    proc, line = _start([*cmd, "--host", "127.0.0.1", "--port", "0", "--tps", "800", "--ttft-ms", "5", "--seed", "7"])
    try:
        match = re.fullmatch(r"simulated model on (http://127\.0\.0\.1:(\d+)/v1) \(tps=800, ttft=5 ms, seed=7\)", line)
        assert match, line
        url = match.group(1)
        with httpx2.Client() as http:
            models = http.get(f"{url}/models").json()
            assert "sim" in [m["id"] for m in models["data"]]
            reply = http.post(f"{url}/chat/completions", json={"model": "sim", "messages": MSGS}).json()
        assert reply["choices"][0]["message"]["content"] == expected_text(MSGS, 7, "sim", 120)
    finally:
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert stderr == "" and stdout == ""


async def test_slow_variant_divides_tps() -> None:
    async with asgi_client(make_app(tps=1000, ttft_ms=0, reply_tokens=3)) as client:
        raw = await client.chat.completions.with_raw_response.create(model="sim+slow", messages=MSGS)
    assert raw.headers["x-sim-tps"] == "100"
    assert raw.parse().choices[0].message.content == expected_text(MSGS, 0, "sim", 3)


async def test_bench_smoke() -> None:
    from collab.simulator.bench import run_bench, simulator_process

    with simulator_process(tps=200, reply_tokens=1000) as (port, pid):
        result = await run_bench(port, pid, streams=2, tps=200, seconds=2.0)
    assert result.errors == 0
    assert result.chunks > 0
    assert "chunks/s" in result.line()


def test_listening_socket_is_tcp_so_asyncio_sets_nodelay() -> None:
    # asyncio turns Nagle off only for sockets whose proto is IPPROTO_TCP (accepted
    # sockets inherit it); without it small SSE writes wait ~40 ms for delayed ACKs.
    import socket

    from collab.simulator.server import bind_socket

    sock = bind_socket("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()
