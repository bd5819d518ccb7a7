"""The storm scenario's restart and its figures (issue 38; docs/loadtest.md, "storm").

While every socket is open and some replies stream, :class:`Restart` restarts the server
process (SIGTERM: it drains, collab/chat/lifecycle.py; then a new Daphne on the same port)
or the run's own Redis (stopped, then started on the same port). Every socket then
reconnects with the page's back-off (collab.loadtest.backoff). :func:`storm_report` turns
what the members measured and the restart's times into the report's ``storm`` object.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from collab.loadtest.sampler import Sampler
from collab.loadtest.stack import Processes, wait_http
from collab.loadtest.stats import Collector, percentiles

__all__ = ["Restart", "check", "go_at", "mark_posters", "storm_line", "storm_report"]

_EXIT_TIMEOUT_S = 60.0  # the old server's drain (COLLAB_DRAIN_S) and its stopping


class Restart(threading.Thread):
    """Restart the server process (``what="server"``) or Redis (``"redis"``), once."""

    def __init__(self, what: str, procs: Processes, sampler: Sampler, commands: dict[str, Any], target: str) -> None:
        super().__init__(name="loadtest-storm", daemon=True)
        self.what = what
        self.procs = procs
        self.sampler = sampler
        self.commands = commands  # name -> (cmd, env), as the stack started them
        self.target = target
        self.at = 0.0  # wall clock: the old server signalled, or Redis stopped
        self.down_s: float | None = None  # signal -> old process gone (its drain)
        self.up_at = 0.0  # wall clock: the new process answers (/healthz), or Redis does
        self.cpu_up = 0.0  # the new server's CPU seconds when it first answered (its start-up)
        self.error = ""
        self.go_at = 0.0  # wall clock: the rooms began posting

    def due(self, progress: Path, after_s: float) -> bool:
        """Whether to restart now: ``after_s`` after the rooms began posting, once."""
        if self.at or self.is_alive():
            return False
        self.go_at = self.go_at or go_at(progress)
        return bool(self.go_at) and time.time() >= self.go_at + after_s

    def report(self, col: Collector, progress: Path, sockets: int, say: Any) -> dict[str, Any]:
        """After the level: the report's ``storm`` object, also printed."""
        self.join(_EXIT_TIMEOUT_S + 30)
        storm = storm_report(col, self, self.go_at or go_at(progress), sockets, self.sampler)
        say(storm_line(storm))
        return storm

    def run(self) -> None:
        try:
            self._restart()
        except Exception as exc:  # reported, not raised: the run goes on and says so
            self.error = f"{type(exc).__name__}: {exc}"

    def _restart(self) -> None:
        name = "daphne" if self.what == "server" else "redis"
        old = self.procs.procs[name]
        cmd, env = self.commands[name]
        self.at = time.time()
        if self.what == "server":
            os.killpg(old.pid, signal.SIGTERM)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(old.pid, signal.SIGKILL)  # Redis gone at once, as a crash or failover
        try:
            old.wait(_EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(old.pid, signal.SIGKILL)
            old.wait(10)
        self.down_s = round(time.time() - self.at, 3)
        self.procs.procs.pop(name, None)
        new = self.procs.start(name, cmd, env)
        if self.what == "server":
            wait_http(self.target + "/healthz", new, "the restarted server")
            self.sampler.unwatch("server/0")
            self.sampler.watch("server/0", new.pid, group="server")
            self.cpu_up = _cpu_s(new.pid)
        else:
            from collab.loadtest.stack import redis_answers

            url = self.commands["redis_url"]
            while not redis_answers(url):
                if new.poll() is not None:
                    raise RuntimeError("redis-server did not start again")
                time.sleep(0.05)  # polling a starting server
        self.up_at = time.time()


def mark_posters(rooms: list[dict[str, Any]], share: float) -> None:
    """Every k-th room (k = 1 / share) streams a long reply at the restart."""
    if share > 0:
        for room in rooms[:: max(1, round(1 / share))]:
            room["storm_post"] = True


def go_at(progress: Path) -> float:
    """When the rooms began posting (wall clock), from the generator's progress file; 0: not yet."""
    try:
        return float(json.loads(progress.read_text()).get("go_at") or 0.0)
    except (OSError, ValueError):
        return 0.0


def check(opts: Any, commands: dict[str, Any], processes: int) -> None:
    """What a storm run refuses (docs/loadtest.md, "The storm")."""
    if opts.storm == "redis" and "redis" not in commands:
        raise RuntimeError("--storm redis restarts the run's own Redis: not with --redis env|URL")
    if processes > 1:
        raise RuntimeError("storm restarts one server process: not with --processes")


def _cpu_s(pid: int) -> float:
    try:
        p = psutil.Process(pid)
        total = 0.0
        for q in [p, *p.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = q.cpu_times()
                total += t.user + t.system
        return total
    except psutil.Error:
        return 0.0


def _cpu_at(sampler: Sampler, name: str, at: float) -> float | None:
    """The watched process's cumulative CPU seconds in the first sample at or after ``at``."""
    later = [s for s in sampler.samples if s[0] >= at and name in s[1]]
    if later:
        return later[0][1][name][0]
    before = [s for s in sampler.samples if name in s[1]]
    return before[-1][1][name][0] if before else None


def storm_report(col: Collector, restart: Restart, go_at: float, sockets: int, sampler: Sampler) -> dict[str, Any]:
    """The report's ``storm`` object (docs/wire.md, the load-test report)."""
    counts = col.counts
    back = col.hists["storm_back_ms"]
    shift = (restart.at - go_at) * 1000.0 if restart.at and go_at else 0.0
    last = back.quantile(1.0)
    open_at_end = counts.get("sockets_open_at_end", 0)
    # Every socket open again with a snapshot taken after the restart: by reconnecting, or (a
    # Redis restart the server rides out) a fresh snapshot on the socket that stayed open.
    resync = col.hists["storm_resync_ms"]
    all_back = bool(restart.at) and back.n + resync.n >= sockets and open_at_end >= sockets
    last = max(filter(None, [last, resync.quantile(1.0)]), default=None)
    per_s = {int(k.removeprefix("storm_sec_")): n for k, n in counts.items() if k.startswith("storm_sec_")}
    connects = sum(per_s.values())
    brought = connects + resync.n
    # CPU from the restart to the last socket back. The server restarted: the new process's
    # CPU from when it answered (its start-up left out); Redis restarted: the one process's.
    cpu_s: float | None = None
    end = go_at + (last or 0.0) / 1000.0
    if restart.at and last is not None:
        if restart.what == "server":
            cpu_end = _cpu_at(sampler, "server/0", end)
            cpu_s = None if cpu_end is None else max(0.0, cpu_end - restart.cpu_up)
        else:
            start_cpu, cpu_end = _cpu_at(sampler, "server", restart.at), _cpu_at(sampler, "server", end)
            cpu_s = None if start_cpu is None or cpu_end is None else max(0.0, cpu_end - start_cpu)
    closes = {k.removeprefix("close_"): n for k, n in sorted(counts.items()) if k.startswith("close_")}
    return {
        "restarted": restart.what,
        "error": restart.error or None,
        "old_process_exit_s": restart.down_s,
        "back_up_s": round(restart.up_at - restart.at, 3) if restart.up_at and restart.at else None,
        "sockets": sockets,
        "sockets_back": back.n,
        "sockets_open_at_end": open_at_end,
        "all_back": all_back,
        "all_back_s": round((last - shift) / 1000.0, 3) if all_back and last is not None else None,
        "snapshots_in_place": col.hists["storm_resync_ms"].n,
        "snapshot_in_place_from_restart_ms": percentiles(col.hists["storm_resync_ms"], shift=shift),
        "connects": connects,
        "peak_connects_per_s": max(per_s.values()) if per_s else 0,
        "first_frame_from_restart_ms": percentiles(back, shift=shift),
        "first_frame_from_attempt_ms": percentiles(col.hists["storm_attempt_ms"]),
        "server_cpu_s": round(cpu_s, 3) if cpu_s is not None else None,
        # Per socket brought back: reconnected, or given a fresh snapshot in place.
        "server_cpu_ms_per_connect": round(cpu_s * 1000 / brought, 3) if cpu_s is not None and brought else None,
        "closes": closes,
        "refused_4429": closes.get("4429", 0),
        "reconnects": counts.get("reconnects", 0),
        "errors": counts.get("errors", 0),
        "integrity": {
            "replies_resumed": counts.get("storm_resumed", 0),
            "replies_ended_while_away": counts.get("storm_ended_away", 0),
            "resume_mismatch": counts.get("storm_resume_mismatch", 0),
            "chars_lost": counts.get("chars_lost", 0),
            "chars_duplicated": counts.get("chars_duplicated", 0),
            "chars_out_of_order": counts.get("chars_out_of_order", 0),
            "replies_completed": counts.get("replies_completed", 0),
            "replies_failed": counts.get("replies_failed", 0),
            "held": not any(
                counts.get(k, 0)
                for k in ("storm_resume_mismatch", "chars_lost", "chars_duplicated", "chars_out_of_order")
            ),
        },
    }


def storm_line(storm: dict[str, Any]) -> str:
    """The printed summary."""
    ff = storm["first_frame_from_restart_ms"]
    fa = storm["first_frame_from_attempt_ms"]
    i = storm["integrity"]
    return (
        f"storm ({storm['restarted']} restarted): {storm['sockets_back']}/{storm['sockets']} sockets back"
        f" with their snapshot ({storm['snapshots_in_place']} fresh snapshots in place),"
        f" all back {storm['all_back_s']} s after the restart"
        f" (old process gone {storm['old_process_exit_s']} s, back up {storm['back_up_s']} s);"
        f" peak {storm['peak_connects_per_s']} connects/s; first frame from restart p50 {ff['p50']} p99 {ff['p99']} ms,"
        f" from its attempt p50 {fa['p50']} p99 {fa['p99']} ms;"
        f" in place p50 {storm['snapshot_in_place_from_restart_ms']['p50']} ms;"
        f" server CPU {storm['server_cpu_s']} s, {storm['server_cpu_ms_per_connect']} ms"
        f" per connect; closes {storm['closes']}; errors {storm['errors']};"
        f" integrity {'held' if i['held'] else 'BROKEN'} (resumed {i['replies_resumed']},"
        f" ended while away {i['replies_ended_while_away']}, lost {i['chars_lost']},"
        f" duplicated {i['chars_duplicated']}, mismatch {i['resume_mismatch']})"
        + (f"; restart error: {storm['error']}" if storm["error"] else "")
    )
