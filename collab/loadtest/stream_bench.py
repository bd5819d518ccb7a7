"""What reading the model's stream costs this process, per token, through `stream_chat`.

    python -m collab.loadtest.stream_bench --streams 8 --tps 750 --seconds 10 --backend aiohttp
    python -m collab.loadtest.stream_bench --streams 8 --backend httpx --loop asyncio
    python -m collab.loadtest.stream_bench --streams 24 --window-ms 30

Starts the simulator in a subprocess (as the load test does: 5 ms write tick), runs
`--streams` concurrent replies through `collab.llm.stream_chat` in this process for
`--seconds`, each started again when it ends, and prints this process's CPU time
divided by the text pieces read (one per token from the simulator): the reader's own
cost per token, with no server around it. `--backend` picks the HTTP transport under
the SDK (collab/llm/client.py), `--loop` the event loop (Daphne runs on uvloop:
collab/web.py). `--window-ms` reads as the streaming engine does, once a window (each
stream's pieces go to a coalescer of that window whose reader waits for its tick,
`Coalescer.pace`; `--no-pace` pushes to the coalescer as the engine did before, at every
socket read); 0: no coalescer. Its figures: docs/benchmarks/2026-12-03.md#b-aiohttp and
docs/benchmarks/2026-12-05.md#b-window-read.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from collab.chat.coalescer import Coalescer
from collab.llm.client import HTTP_BACKENDS, Endpoint, LLMError, aclose_clients, stream_chat
from collab.simulator.bench import simulator_process


async def _drop(offset: int, text: str) -> None:
    """The bench's pieces go nowhere: only the reading is measured."""


async def _read(
    port: int, streams: int, seconds: float, window_s: float = 0.0, pace: bool = True
) -> tuple[int, float, float, int]:
    endpoint = Endpoint(f"http://127.0.0.1:{port}/v1", max_retries=0)
    pieces = errors = 0
    stop_at = 0.0

    async def one(i: int) -> None:
        nonlocal pieces, errors
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            coalescer = Coalescer(window_s, _drop) if window_s > 0 else None
            try:
                messages = [{"role": "user", "content": f"bench {i} {n}"}]
                paced = coalescer.pace if coalescer is not None and pace else None
                async for items in stream_chat(endpoint, "sim", messages, pace=paced):
                    for item in items:
                        if isinstance(item, str):
                            pieces += 1
                            if coalescer is not None:
                                coalescer.push(item)
            except LLMError:
                errors += 1
            finally:
                if coalescer is not None:
                    await coalescer.close()

    # One warm-up reply per stream (connections open, code paths warm), then the clock.
    stop_at = time.monotonic() + 0.5
    await asyncio.gather(*(one(i) for i in range(streams)))
    pieces = errors = 0
    cpu0, wall0 = time.process_time(), time.monotonic()
    stop_at = wall0 + seconds
    await asyncio.gather(*(one(i) for i in range(streams)))
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    await aclose_clients()
    return pieces, cpu, wall, errors


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tps", type=float, default=750.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--reply-tokens", type=int, default=400)
    parser.add_argument("--tick-ms", type=float, default=5.0)
    parser.add_argument("--backend", choices=HTTP_BACKENDS, default="aiohttp")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--window-ms", type=float, default=0.0, help="read once a window, as the engine does")
    parser.add_argument("--no-pace", action="store_true", help="with --window-ms: read every socket read")
    args = parser.parse_args(argv)
    os.environ["COLLAB_LLM_HTTP"] = args.backend
    if args.loop == "uvloop":
        from collab.web import use_uvloop

        use_uvloop()
    with simulator_process(args.tps, args.reply_tokens, tick_ms=args.tick_ms) as (port, _pid):
        pace = not args.no_pace
        pieces, cpu, wall, errors = asyncio.run(_read(port, args.streams, args.seconds, args.window_ms / 1000, pace))
    per_token = cpu / pieces * 1e6 if pieces else float("nan")
    print(
        f"backend={args.backend} loop={args.loop} streams={args.streams} tps={args.tps:g} "
        f"window={args.window_ms:g}ms{' unpaced' if args.no_pace and args.window_ms else ''}: "
        f"{pieces} tokens in {wall:.1f} s ({pieces / wall:,.0f}/s), CPU {cpu / wall:.0%} of a core, "
        f"{per_token:.1f} µs per token, {errors} errors"
    )


if __name__ == "__main__":
    main()
