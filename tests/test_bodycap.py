"""Requests past the largest upload are refused before their body is read
(collab/bodycap.py): by their declared length, or as a chunked body passes the cap."""

from __future__ import annotations

import json
from typing import Any

import pytest

from collab.bodycap import BodyCap, limit
from collab.chat.files.handlers import ENVELOPE


class Inner:
    """An app that reads the whole body, as Django's ASGI handler does first."""

    def __init__(self) -> None:
        self.read = b""
        self.aborted = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.aborted = True
                return
            self.read += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> tuple[Inner, list[dict[str, Any]]]:
    inner, sent = Inner(), []
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> dict[str, Any]:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/r/x/files/", "headers": headers}
    await BodyCap(inner)(scope, receive, send)
    return inner, sent


@pytest.fixture
def small_cap(settings: Any) -> int:
    settings.COLLAB = {**settings.COLLAB, "MAX_FILE_BYTES": 1000}
    return limit()


async def test_a_declared_length_past_the_cap_is_refused_unread(small_cap: int) -> None:
    inner, sent = await call([(b"content-length", str(small_cap + 1).encode())], [b"x" * 10])
    assert inner.read == b"" and not inner.aborted
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"])["error"]["code"] == "file.too_large"


async def test_a_chunked_body_past_the_cap_is_cut_off(small_cap: int) -> None:
    chunk = b"x" * 1024
    inner, sent = await call([], [chunk] * (small_cap // 1024 + 2))
    assert inner.aborted and len(inner.read) <= small_cap
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [413]


async def test_within_the_cap_everything_passes(small_cap: int) -> None:
    body = b"x" * (1000 + ENVELOPE)
    inner, sent = await call([(b"content-length", str(len(body)).encode())], [body[:500], body[500:]])
    assert inner.read == body and sent[0]["status"] == 200
