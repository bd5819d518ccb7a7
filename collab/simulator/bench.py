"""How many SSE chunks per second can one simulator process serve?

    python -m collab.simulator.bench --streams 40 --tps 750 --seconds 8
    python -m collab.simulator.bench --sweep 40,80,160,320 --tps 750

Starts ``python -m collab.simulator`` in a subprocess on a free loopback port,
opens ``--streams`` concurrent streaming completions with a minimal raw-socket
client (so the client costs as little as possible), and prints per run:

- delivered content chunks/s (all streams together),
- the simulator process's CPU use (100% = one core: it is single-threaded),
- token lateness: for every socket read, how late the oldest token in it is
  against its schedule ``x-sim-start + ttft + i/tps`` (p50/p99/max).

When the simulator keeps up, chunks/s equals streams*tps and lateness stays at
a millisecond or two; past its capacity CPU pins at ~100% and lateness grows.
Only loopback traffic, bounded in time; the subprocess is always stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["BenchResult", "main", "run_bench", "simulator_process"]

_EVENT = b"data: {"


@dataclass
class BenchResult:
    streams: int
    tps: float
    seconds: float
    tick_ms: float = 0.0
    chunks: int = 0
    reads: int = 0
    cpu_percent: float = 0.0
    late_ms: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        late = sorted(self.late_ms) or [0.0]

        def pct(p: float) -> float:
            return late[min(len(late) - 1, int(p * len(late)))]

        return (
            f"streams={self.streams:4d} tps={self.tps:g} tick={self.tick_ms:g}ms "
            f"target={self.streams * self.tps:8.0f}/s "
            f"delivered={self.chunks_per_s:8.0f} chunks/s  reads/s={self.reads / self.seconds:7.0f}  "
            f"sim CPU={self.cpu_percent:5.1f}%  late p50={pct(0.5):6.2f} ms p99={pct(0.99):6.2f} ms "
            f"max={late[-1]:7.2f} ms  errors={self.errors}"
        )


@contextlib.contextmanager
def simulator_process(
    tps: float, reply_tokens: int, ttft_ms: float = 0.0, tick_ms: float = 0.0
) -> Iterator[tuple[int, int]]:
    """Run ``python -m collab.simulator`` on a free port; yields ``(port, pid)``."""
    cmd = [
        sys.executable,
        "-m",
        "collab.simulator",
        "--port",
        "0",
        "--tps",
        f"{tps:g}",
        "--ttft-ms",
        f"{ttft_ms:g}",
        "--reply-tokens",
        str(reply_tokens),
        "--tick-ms",
        f"{tick_ms:g}",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "simulated model on http://127.0.0.1:PORT/v1 (...)"
        if not line:
            raise RuntimeError("simulator exited before announcing its port")
        port = int(line.split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        yield port, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


async def _one_stream(port: int, index: int, result: BenchResult, t_from: float, t_to: float) -> None:
    body = json.dumps(
        {"model": "sim", "stream": True, "messages": [{"role": "user", "content": f"bench stream {index}"}]}
    ).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        result.errors += 1
        return
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        headers = dict(line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:] if ": " in line)
        first = float(headers["x-sim-start"]) + float(headers["x-sim-ttft-ms"]) / 1000.0
        tps = float(headers["x-sim-tps"])
        events = 0  # SSE events seen, the role event included
        tail = b""
        while True:
            data = await reader.read(262144)
            now = time.time()
            if not data:
                return
            window = tail + data
            new = window.count(_EVENT)
            if new:
                # Oldest token in this read: content index max(events - 1, 0).
                oldest_due = first + max(events - 1, 0) / tps
                events += new
                if t_from <= now <= t_to:
                    result.chunks += new
                    result.reads += 1
                    result.late_ms.append((now - oldest_due) * 1000.0)
            if b"data: [DONE]" in window:
                return
            tail = window[-(len(_EVENT) - 1) :]
    except (OSError, asyncio.IncompleteReadError, KeyError, ValueError):
        result.errors += 1
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _cpu_seconds(pid: int) -> float:
    """User+system CPU time of a process (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_bench(port: int, pid: int, streams: int, tps: float, seconds: float, tick_ms: float = 0.0) -> BenchResult:
    """Measure during ``[1 s, seconds - 0.5 s]`` of the run (skips ramp-up and tail)."""
    result = BenchResult(streams=streams, tps=tps, seconds=max(seconds - 1.5, 0.5), tick_ms=tick_ms)
    t0 = time.time()
    t_from, t_to = t0 + 1.0, t0 + 1.0 + result.seconds
    tasks = [asyncio.create_task(_one_stream(port, i, result, t_from, t_to)) for i in range(streams)]
    await asyncio.sleep(max(0.0, t_from - time.time()))  # benchmark window, not an event wait
    cpu_before = _cpu_seconds(pid)
    await asyncio.sleep(max(0.0, t_to - time.time()))
    cpu_after = _cpu_seconds(pid)
    result.cpu_percent = 100.0 * (cpu_after - cpu_before) / result.seconds
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collab.simulator.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=40)
    parser.add_argument("--sweep", default="", help="comma-separated stream counts (overrides --streams)")
    parser.add_argument("--tps", type=float, default=750.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--tick-ms", default="0", help="simulator --tick-ms; comma-separated to sweep")
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.sweep.split(",") if x] or [args.streams]
    print(f"simulator bench: {os.cpu_count()} cores, tps={args.tps:g}, {args.seconds:g}s per run", flush=True)
    ticks = [float(x) for x in args.tick_ms.split(",") if x]
    for tick_ms in ticks:
        for streams in counts:
            reply_tokens = int(args.tps * (args.seconds + 2.0))
            with simulator_process(args.tps, reply_tokens, tick_ms=tick_ms) as (port, pid):
                result = asyncio.run(run_bench(port, pid, streams, args.tps, args.seconds, tick_ms))
            print(result.line(), flush=True)


if __name__ == "__main__":
    main()
