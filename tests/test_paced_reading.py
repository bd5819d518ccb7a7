"""The streaming engine reads a steady stream once a window (generation.run_reply with
Coalescer.pace): whatever the model's socket reads, the reader wakes on the window's
ticks and takes all that came meanwhile. Against the simulated model writing every token
on its own, through the real openai client."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import pytest

from collab.chat import generation
from collab.chat.coalescer import Coalescer, WindowClock, window_clock
from collab.chat.generation import Outcome, ReplyJob, registry
from collab.llm import Item
from collab.llm.pool import ProviderConfig
from collab.simulator.testing import running_simulator_app

# Replies stored and the model's clients closed at the end (an unclosed aiohttp session
# is reported at the interpreter's exit).
pytestmark = pytest.mark.usefixtures("replies_idle", "memory_layer")

TOKENS = 600
TPS = 3000.0  # 0.2 s of tokens, each written when due (tick 0): hundreds of socket reads
WINDOW_MS = 30.0


@pytest.fixture(scope="module")
def steady_sim() -> Iterator[str]:
    with running_simulator_app(tps=TPS, ttft_ms=5, reply_tokens=TOKENS, tick_ms=0, seed=3) as (url, _app):
        yield url


class Kept:
    def __init__(self) -> None:
        self.pieces: list[tuple[int, str]] = []
        self.outcomes: list[Outcome] = []

    async def piece(self, offset: int, text: str) -> None:
        self.pieces.append((offset, text))

    async def thought(self, offset: int, text: str) -> None: ...

    async def state(self, text: str) -> None: ...

    async def finish(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)


def observe_pace(monkeypatch: pytest.MonkeyPatch, steps: list[str]) -> None:
    """Each wait of the reader for its window is noted in `steps` as "pace"."""
    real_pace = Coalescer.pace

    def pace(self: Coalescer) -> asyncio.Future[None]:
        steps.append("pace")
        return real_pace(self)

    monkeypatch.setattr(Coalescer, "pace", pace)


async def reply(url: str, message_id: int) -> Kept:
    """A reply of the simulated model streamed through the engine: done, every token in
    its pieces, in order."""
    config = ProviderConfig(name=f"p-{uuid.uuid4().hex}", base_urls=(url,), read_timeout_s=5)
    job = ReplyJob(message_id, 10**9, config, "sim", [{"role": "user", "content": "go"}], None, None)
    kept = Kept()
    live = registry.start(job, kept)
    assert live.task is not None
    async with asyncio.timeout(20):
        await live.task
    [outcome] = kept.outcomes
    assert outcome.status == "done" and outcome.tokens == TOKENS
    assert "".join(text for _, text in kept.pieces) == outcome.text  # every token, in order
    return kept


@pytest.mark.parametrize("window_ms", [WINDOW_MS, 0.0])
async def test_a_steady_stream_is_read_once_a_window(
    steady_sim: str, settings: Any, monkeypatch: pytest.MonkeyPatch, window_ms: float
) -> None:
    settings.COLLAB = {**settings.COLLAB, "COALESCE_MS": window_ms}
    loop = asyncio.get_running_loop()
    reads: list[tuple[float, int]] = []  # when the engine took each read's items, and how many
    steps: list[str] = []  # "read" and "pace", in order
    real = generation.stream_reply

    async def counted(*args: Any, **kwargs: Any) -> AsyncGenerator[list[Item], None]:
        async for items in real(*args, **kwargs):  # the real stream, observed
            reads.append((loop.time(), len(items)))
            steps.append("read")
            yield items

    monkeypatch.setattr(generation, "stream_reply", counted)
    observe_pace(monkeypatch, steps)
    kept = await reply(steady_sim, 10**9 + 7)
    streaming_s = reads[-1][0] - reads[0][0]
    # The stream's end is not waited for: no wait after the read that held its finish.
    assert steps[-1] == "read"
    if window_ms:
        # After the first read, one a tick: at most the ticks the stream lasted, and the end.
        assert len(reads) <= streaming_s / (window_ms / 1000) + 3
        assert len(kept.pieces) <= streaming_s / (window_ms / 1000) + 3
        assert steps.count("pace") >= len(reads) - 2  # between the reads (not always after the first)
    else:  # no window (the naive baseline): read as it comes, a piece a token
        assert len(kept.pieces) == TOKENS
        assert len(reads) > streaming_s / (WINDOW_MS / 1000) + 3


async def test_the_body_s_end_is_read_at_once_not_on_the_next_tick(
    steady_sim: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader waiting for its window's tick is woken when the response's body ends
    meanwhile (stream_chat, through aiohttp's end of body): the reply's last tokens and
    its end go at once, not on a tick up to a window later. With a window of seconds and
    a stream of 0.2 s, the reply is over before any tick fires."""
    settings.COLLAB = {**settings.COLLAB, "COALESCE_MS": 4000.0}
    fired: list[tuple[float, int]] = []
    steps: list[str] = []
    real_fire = WindowClock._fire

    def fire(self: WindowClock, key: tuple[float, int]) -> None:
        fired.append(key)
        real_fire(self, key)

    monkeypatch.setattr(WindowClock, "_fire", fire)
    observe_pace(monkeypatch, steps)
    kept = await reply(steady_sim, 10**9 + 9)
    assert "pace" in steps  # the reader did wait for its window...
    assert fired == []  # ...and was woken by the body's end, not by a tick
    assert len(kept.pieces) == 2  # the first piece at once, the rest as the stream ended
    assert window_clock()._ticks == {}  # nobody is left waiting on the window's tick
