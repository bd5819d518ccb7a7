"""How to keep a live reply's text in Redis, chosen by measurement
(docs/benchmarks/2026-12-02.md#b-live-text).

    python -m collab.loadtest.live_state_bench [--redis URL] [--pieces N] [--piece-chars C]

For each way of recording a flushed piece beside its broadcast (a PUBLISH, what the
channel layer does), it times N pieces one after another, as one reply's sink does, and
prints the wall time and this process's CPU time per piece; then the cost of the read a
connecting member makes (the whole text so far). Only raw Redis commands: nothing of the
app is imported, so the figures are Redis's and the client's alone.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

Step = Callable[[aioredis.Redis, str, int, str], Awaitable[None]]


async def publish_only(r: aioredis.Redis, key: str, i: int, text: str) -> None:
    await r.publish(key + ":ch", text)


async def append_then_publish(r: aioredis.Redis, key: str, i: int, text: str) -> None:
    await r.append(key, text)
    await r.publish(key + ":ch", text)


async def xadd_then_publish(r: aioredis.Redis, key: str, i: int, text: str) -> None:
    await r.xadd(key, {"o": i, "t": text})
    await r.publish(key + ":ch", text)


async def pipelined_append_publish(r: aioredis.Redis, key: str, i: int, text: str) -> None:
    async with r.pipeline(transaction=False) as pipe:
        pipe.append(key, text)
        pipe.publish(key + ":ch", text)
        await pipe.execute()


_SCRIPT = "redis.call('APPEND', KEYS[1], ARGV[1]) return redis.call('PUBLISH', ARGV[2], ARGV[3])"


async def scripted_append_publish(r: aioredis.Redis, key: str, i: int, text: str) -> None:
    # What collab does (collab/chat/shared/redis.py): one command, in that order.
    await r.evalsha(_sha, 1, key, text, key + ":ch", text)  # type: ignore[misc]


_sha = ""

WAYS: dict[str, Step] = {
    "PUBLISH only (no live state)": publish_only,
    "APPEND, then PUBLISH": append_then_publish,
    "XADD, then PUBLISH": xadd_then_publish,
    "APPEND + PUBLISH pipelined": pipelined_append_publish,
    "APPEND + PUBLISH in one script": scripted_append_publish,
}


async def _time(r: aioredis.Redis, step: Step, pieces: int, text: str) -> tuple[float, float]:
    key = f"bench:{uuid.uuid4().hex}"
    for i in range(50):  # warm the connection
        await step(r, key + "w", i, text)
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(pieces):
        await step(r, key, i, text)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await r.delete(key, key + "w")
    return wall / pieces * 1e6, cpu / pieces * 1e6


async def _read(r: aioredis.Redis, chars: int, piece_chars: int, rounds: int = 300) -> dict[str, float]:
    text_key, stream_key = f"bench:{uuid.uuid4().hex}", f"bench:{uuid.uuid4().hex}"
    piece = "x" * piece_chars
    for i in range(chars // piece_chars):
        await r.append(text_key, piece)
        await r.xadd(stream_key, {"o": i * piece_chars, "t": piece})
    out = {}
    for name, read in (("GET (APPEND)", lambda: r.get(text_key)), ("XRANGE (XADD)", lambda: r.xrange(stream_key))):
        start = time.perf_counter()
        for _ in range(rounds):
            await read()
        out[name] = (time.perf_counter() - start) / rounds * 1e6
    await r.delete(text_key, stream_key)
    return out


async def main(url: str, pieces: int, piece_chars: int) -> None:
    global _sha
    r = aioredis.Redis.from_url(url)
    _sha = await r.script_load(_SCRIPT)
    text = "w" * piece_chars
    print(f"{pieces} pieces of {piece_chars} characters, one after another, Redis {url}")
    print(f"{'way':32} {'wall us/piece':>14} {'client CPU us/piece':>20}")
    for name, step in WAYS.items():
        wall, cpu = await _time(r, step, pieces, text)
        print(f"{name:32} {wall:14.1f} {cpu:20.1f}")
    for chars in (2_000, 12_000):
        reads = await _read(r, chars, piece_chars)
        line = ", ".join(f"{name} {us:.0f} us" for name, us in reads.items())
        print(f"snapshot read of a {chars:,}-character reply: {line}")
    await r.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--pieces", type=int, default=5000)
    parser.add_argument("--piece-chars", type=int, default=90, help="~22 tokens: 30 ms of a 750 tokens/s reply")
    args = parser.parse_args()
    asyncio.run(main(args.redis, args.pieces, args.piece_chars))
