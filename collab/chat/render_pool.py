"""Rendering in worker processes, each killed at the render budget (markup.py says why).

A pure-Python loop in a thread cannot be stopped, and it holds the GIL the event loop
needs: so each render goes to a worker process (`python -m collab.chat.render_worker`,
which imports markup.py and nothing of Django), over its stdin and stdout. A render that
is not back by its deadline (settings.COLLAB["RENDER_BUDGET_S"] after it was asked for,
queueing included) has its worker killed and replaced, and the caller gets None: it
shows the text plain (markup.plain). A crashed worker is replaced the same way.

The pool is this process's own: RENDER_WORKERS threads, each owning one worker and
serving one render at a time, so renders never take a thread of the event loop's
executor while they wait (markup.arender_markdown). A text longer than SHORT_CHARS may
use every worker but one: every slow shape needs length, so however many long renders
come at once, a short post is rendered by the worker kept for it, not queued behind them.

A worker costs this process a few system calls a render (~10 µs of CPU for a short text,
~90 µs for 8,000 characters that take ~20 ms to render: that CPU is the worker's now).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import logging
import math
import os
import select
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_BUDGET_S = 2.0
DEFAULT_WORKERS = 2
SHORT_CHARS = 2_000

# The wire between the pool and a worker. Request: kind (True: a person's message), the
# seconds left, then the text's UTF-8 (lone surrogates passed through: markup replaces
# them). Reply: ok (False: the render raised, the body says what), then the body.
REQUEST = struct.Struct("<?dI")
REPLY = struct.Struct("<?I")

WORKER_COMMAND = (sys.executable, "-m", "collab.chat.render_worker")


class WorkerFailed(Exception):
    """A render failed: its worker is `broken` (it died, or closed a pipe), or its
    renderer raised (the worker is fine)."""

    def __init__(self, message: str, *, broken: bool) -> None:
        super().__init__(message)
        self.broken = broken


def budget_s() -> float:
    """The render budget: settings.COLLAB["RENDER_BUDGET_S"], read at each render (a
    test or an operator may change it), or DEFAULT_BUDGET_S with no settings."""
    from django.conf import settings  # not at the top: the worker imports this module without Django

    if not settings.configured:
        return DEFAULT_BUDGET_S
    return float(settings.COLLAB.get("RENDER_BUDGET_S", DEFAULT_BUDGET_S))


def _worker_env() -> dict[str, str]:
    """This process's environment, with the directory that holds this `collab` first on
    the path: the worker renders with this very code, whatever its working directory."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


class _Worker:
    """One worker process and its two pipes (non-blocking: every wait has a deadline)."""

    def __init__(self, command: tuple[str, ...], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._out, self._in = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        os.set_blocking(self._out, False)
        os.set_blocking(self._in, False)

    def render(self, text: bytes, user: bool, deadline: float) -> str | None:
        """The worker's HTML for `text`, or None if the deadline came first (the worker is
        then mid-render: only kill() is left). WorkerFailed if it broke or its render raised."""
        left = deadline - time.monotonic()
        if not (self._write(REQUEST.pack(user, left, len(text)), deadline) and self._write(text, deadline)):
            return None
        header = self._read(REPLY.size, deadline)
        if header is None:
            return None
        ok, size = REPLY.unpack(header)
        body = self._read(size, deadline)
        if body is None:
            return None
        if not ok:
            raise WorkerFailed(body.decode("utf-8", "replace"), broken=False)
        return body.decode("utf-8", "surrogatepass")

    def _write(self, data: bytes, deadline: float) -> bool:
        view = memoryview(data)
        while view:
            if not _ready(self._out, select.POLLOUT, deadline):
                return False
            try:
                view = view[os.write(self._out, view) :]
            except OSError as exc:  # BrokenPipeError: it died
                raise WorkerFailed(f"write: {exc}", broken=True) from exc
        return True

    def _read(self, size: int, deadline: float) -> bytes | None:
        data = bytearray()
        while len(data) < size:
            if not _ready(self._in, select.POLLIN, deadline):
                return None
            chunk = os.read(self._in, size - len(data))
            if not chunk:
                raise WorkerFailed(f"exited with {self.proc.poll()}", broken=True)
            data += chunk
        return bytes(data)

    def stop(self, kill: bool) -> None:
        """Kill it (it is mid-render), or close its stdin and let it end (it is idle)."""
        if kill:
            self.proc.kill()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        try:
            self.proc.wait(1.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _ready(fd: int, event: int, deadline: float) -> bool:
    """Wait for `fd` until the deadline. poll, not select: a busy server's descriptors
    go past select's 1,024."""
    left = deadline - time.monotonic()
    if left <= 0:
        return False
    poller = select.poll()
    poller.register(fd, event)
    return bool(poller.poll(math.ceil(left * 1000)))


@dataclass(eq=False)
class _Job:
    text: bytes
    user: bool
    deadline: float
    future: concurrent.futures.Future[str | None] = field(default_factory=concurrent.futures.Future)


class Pool:
    """`workers` threads, each with its worker process; the last takes short texts only
    (with one worker, it takes all). `command` starts a worker (tests start ones that
    hang or die)."""

    def __init__(self, workers: int = DEFAULT_WORKERS, command: tuple[str, ...] = WORKER_COMMAND) -> None:
        self._command = command
        self._env = _worker_env()
        self._lock = threading.Condition()
        self._short: collections.deque[_Job] = collections.deque()
        self._long: collections.deque[_Job] = collections.deque()
        self._closed = False
        self._workers: dict[int, _Worker] = {}  # by thread: close() kills them mid-render
        self.outcomes: collections.Counter[str] = collections.Counter()  # rendered, deadline, failed
        lanes = [workers <= 1 or i < workers - 1 for i in range(max(1, workers))]  # takes long texts?
        self._threads = [
            threading.Thread(target=self._serve, args=(i, long), name=f"render-{i}", daemon=True)
            for i, long in enumerate(lanes)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, text: str, user: bool, deadline: float) -> concurrent.futures.Future[str | None]:
        """The future of `text`'s HTML: None if the render missed `deadline` or failed."""
        job = _Job(text.encode("utf-8", "surrogatepass"), user, deadline)
        with self._lock:
            if self._closed:  # the process is ending: its last texts are shown plain
                job.future.set_result(None)
                return job.future
            (self._short if len(text) <= SHORT_CHARS else self._long).append(job)
            self._lock.notify_all()  # a thread of the short lane must not swallow a long job's wake-up
        return job.future

    def _next(self, takes_long: bool) -> _Job | None:
        with self._lock:
            while True:
                if self._short:
                    return self._short.popleft()
                if takes_long and self._long:
                    return self._long.popleft()
                if self._closed:
                    return None
                self._lock.wait()

    def _start(self, slot: int) -> _Worker | None:
        try:
            worker = _Worker(self._command, self._env)  # not under the lock: submit() takes it on the event loop
        except OSError:
            log.exception("could not start a render worker: texts are shown plain until one starts")
            return None
        with self._lock:
            if not self._closed:
                self._workers[slot] = worker
                return worker
        worker.stop(kill=True)
        return None

    def _serve(self, slot: int, takes_long: bool) -> None:
        worker = self._start(slot)  # now, not at the first render: a worker takes ~0.1 s to import
        try:
            while (job := self._next(takes_long)) is not None:
                worker = self._run(slot, job, worker)
        finally:
            if worker is not None:
                worker.stop(kill=False)

    def _run(self, slot: int, job: _Job, worker: _Worker | None) -> _Worker | None:
        """Render `job` on `worker`; return the worker to use next (a new one in place of
        one killed at the deadline or broken)."""
        if not job.future.set_running_or_notify_cancel():
            self._count("deadline")  # its caller stopped waiting while it was queued
            return worker
        html = None
        try:
            if time.monotonic() >= job.deadline:
                self._count("deadline")
            elif worker is None and (worker := self._start(slot)) is None:
                self._count("failed")
            elif (html := worker.render(job.text, job.user, job.deadline)) is None:
                self._count("deadline")  # mid-render: killing it is the only way to stop it
                log.warning("a render missed its deadline (%d bytes): shown plain", len(job.text))
                worker.stop(kill=True)
                worker = self._start(slot)
            else:
                self._count("rendered")
        except WorkerFailed as exc:
            self._count("failed")
            if not self._closed:  # else close() killed it
                log.error("a render failed (%d bytes): shown plain: %s", len(job.text), exc)
            if exc.broken and worker is not None:
                worker.stop(kill=True)
                worker = self._start(slot)
        finally:
            job.future.set_result(html)
        return worker

    def _count(self, outcome: str) -> None:
        with self._lock:
            self.outcomes[outcome] += 1
        from collab.chat import metrics  # not at the top: the worker imports this module

        metrics.RENDERS.labels(outcome).inc()

    def close(self, timeout: float = 5.0) -> None:
        """Stop: the queued renders get None (their texts are shown plain), the running
        ones are killed, the workers end."""
        with self._lock:
            self._closed = True
            queued = [*self._short, *self._long]
            self._short.clear()
            self._long.clear()
            self._lock.notify_all()
            for worker in self._workers.values():
                worker.proc.kill()  # a render running now fails at once (WorkerFailed)
        for job in queued:
            if job.future.set_running_or_notify_cancel():
                job.future.set_result(None)
        for thread in self._threads:
            thread.join(timeout)


_pool: Pool | None = None
_pool_lock = threading.Lock()


def pool() -> Pool:
    """This process's pool, started at its first render (settings.COLLAB["RENDER_WORKERS"])."""
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                from django.conf import settings

                workers = settings.COLLAB.get("RENDER_WORKERS", DEFAULT_WORKERS) if settings.configured else None
                _pool = Pool(int(workers or DEFAULT_WORKERS))
    return _pool


def _forget_after_fork() -> None:
    """A forked child has none of the pool's threads: it starts its own pool."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


@atexit.register
def _close() -> None:
    if _pool is not None:
        _pool.close(timeout=1.0)


def render(text: str, *, user: bool) -> str | None:
    """`text`'s HTML, or None once the budget is spent; blocks this thread meanwhile."""
    deadline = time.monotonic() + budget_s()
    future = pool().submit(text, user, deadline)
    try:
        return future.result(timeout=max(0.0, deadline - time.monotonic()))
    except concurrent.futures.TimeoutError:
        future.cancel()
        return None


async def arender(text: str, *, user: bool) -> str | None:
    """render() for the event loop: it waits on the future, holding no thread."""
    deadline = time.monotonic() + budget_s()
    future = pool().submit(text, user, deadline)
    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            return await asyncio.wrap_future(future)  # cancelled at the timeout: a queued job is dropped
    except TimeoutError:
        return None
