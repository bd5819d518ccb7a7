"""collab's simulated users, for Locust.

    locust -f collab/loadtest/locustfile.py --headless -u ROOMS -r ROOMS \\
        --collab-config run.json [--processes N]

One Locust user plays one room: all of its members (and their tabs), so that the
spread of one piece's arrival across a room's members is measured in one process on
one clock. Give Locust as many users as the config has rooms. Rooms are handed out
by the master (custom messages), so plain ``--processes N``, ``--master``/``--worker``
on several machines and the local runner all work.

What Locust sees: a request event ``login`` and ``connect`` per member, ``first token``
(post -> first piece at that member) and ``reply`` (post -> final article, failed when
a check fails) per reply and member. Per-piece figures (delivery lag, skew) stay in
local histograms that each room sends to the master when it ends; the master merges
them and writes the result file the ``loadtest`` command reads. The run ends by itself
when every room is done.

It imports nothing from the app: it needs the server's address and the accounts.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import gevent
import gevent.event
from locust import User, events, runners, task
from locust.env import Environment
from locust.exception import StopUser
from locust.runners import MasterRunner, Runner, WorkerRunner

from collab.loadtest.client import probe_model_ttft
from collab.loadtest.config import RunConfig
from collab.loadtest.room import RoomRun
from collab.loadtest.stats import Collector

log = logging.getLogger("collab.loadtest")

# Live counters reach the master every second instead of every 3 (progress display).
runners.WORKER_REPORT_INTERVAL = 1.0


def _node() -> str:
    """This process (computed when asked: ``--processes`` forks after importing this file)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class _State:
    """Per process: the config, what this process measured, and the run's coordination."""

    cfg: RunConfig | None = None
    collector = Collector()
    live: dict[str, int] = {}
    claims: dict[str, gevent.event.AsyncResult] = {}
    go = gevent.event.AsyncResult()
    cpu_start: tuple[float, float] | None = None
    probe: gevent.Greenlet | None = None
    # master / local runner only
    next_room = 0
    ready = 0
    merged = Collector()
    live_by_node: dict[str, dict[str, int]] = {}
    written = False
    phase = "starting"
    started = time.time()
    go_at = 0.0  # when posting begins, wall clock (the storm's restart is timed from it)


S = _State()


def _runner(environment: Environment) -> Runner:
    runner = environment.runner
    assert runner is not None, "collab: the locustfile needs a runner"
    return runner


def _config(environment: Environment) -> RunConfig:
    if S.cfg is None:
        options = environment.parsed_options
        path = getattr(options, "collab_config", "") if options is not None else ""
        path = path or os.environ.get("COLLAB_LOADTEST_CONFIG", "")
        if not path:
            raise RuntimeError("collab: pass --collab-config FILE (or COLLAB_LOADTEST_CONFIG)")
        S.cfg = RunConfig.load(path)
    return S.cfg


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    parser.add_argument("--collab-config", default="", help="collab load-test run config (JSON)")


def _is_coordinator(environment: Environment) -> bool:
    return not isinstance(environment.runner, WorkerRunner)


def _runs_users(environment: Environment) -> bool:
    return not isinstance(environment.runner, MasterRunner)


# --- coordination: rooms are handed out, posting starts at once everywhere ---------------


def _on_claim(environment: Environment, msg: Any, **_kw: Any) -> None:
    cfg = _config(environment)
    index = S.next_room if S.next_room < len(cfg.rooms) else None
    S.next_room += 1
    target = None if msg.node_id == "local" else msg.node_id
    answer = {"req": msg.data["req"], "room": index}
    _runner(environment).send_message("collab_room", answer, client_id=target)


def _on_room(environment: Environment, msg: Any, **_kw: Any) -> None:
    result = S.claims.pop(msg.data["req"], None)
    if result is not None:
        result.set(msg.data["room"])


def _on_ready(environment: Environment, msg: Any, **_kw: Any) -> None:
    cfg = _config(environment)
    S.ready += 1
    if S.ready == len(cfg.rooms):
        S.phase = "run"
        go = time.time() + 0.5
        S.go_at = go
        _runner(environment).send_message("collab_go", {"at": go})


def _on_go(environment: Environment, msg: Any, **_kw: Any) -> None:
    if not S.go.ready():
        S.go.set(msg.data["at"])


def _on_done(environment: Environment, msg: Any, **_kw: Any) -> None:
    cfg = _config(environment)
    S.merged.merge(Collector.from_json(msg.data["collector"]))
    if S.merged.rooms_done >= len(cfg.rooms):
        S.phase = "done"
        _write_result(environment, complete=True)
        gevent.spawn_later(0.2, _runner(environment).quit)


def _write_result(environment: Environment, complete: bool) -> None:
    if S.written:
        return
    S.written = True
    cfg = _config(environment)
    _write_progress(environment)
    if cfg.out:
        data = {"complete": complete, "collector": S.merged.to_json(), "finished_at": time.time()}
        Path(cfg.out).write_text(json.dumps(data))


def _write_progress(environment: Environment) -> None:
    cfg = _config(environment)
    if not cfg.progress:
        return
    live: dict[str, int] = {}
    sources = list(S.live_by_node.values())
    if _runs_users(environment):
        sources.append(S.live)
    for values in sources:
        for k, v in values.items():
            live[k] = live.get(k, 0) + v
    data = {
        "phase": S.phase,
        "rooms": len(cfg.rooms),
        "rooms_ready": S.ready,
        "rooms_done": S.merged.rooms_done,
        "elapsed_s": round(time.time() - S.started, 1),
        "go_at": S.go_at,
        "live": live,
        "at": time.time(),
    }
    tmp = cfg.progress + ".tmp"
    Path(tmp).write_text(json.dumps(data))
    os.replace(tmp, cfg.progress)


def _progress_loop(environment: Environment) -> None:
    while not S.written:
        try:
            _write_progress(environment)
        except OSError as exc:
            log.warning("collab: cannot write progress: %s", exc)
        gevent.sleep(0.5)


def _probe_loop(environment: Environment) -> None:
    """The model's own TTFT, measured directly, while the rooms post."""
    cfg = _config(environment)
    go_at = S.go.get()
    gevent.sleep(max(0.0, go_at - time.time()))
    end = go_at + cfg.duration_s
    while time.time() < end:
        try:
            S.collector.add("model_ttft_ms", probe_model_ttft(cfg.model_url, cfg.model_name) * 1000)
        except OSError as exc:
            S.collector.error("model.probe_failed")
            log.warning("collab: model probe failed: %s", exc)
        gevent.sleep(cfg.probe_interval_s)


@events.init.add_listener
def _on_init(environment: Environment, **_kw: Any) -> None:
    runner = environment.runner
    if runner is None:
        return
    cfg = _config(environment)
    if _is_coordinator(environment):
        runner.register_message("collab_claim", _on_claim)
        runner.register_message("collab_ready", _on_ready)
        runner.register_message("collab_done", _on_done)
        gevent.spawn(_progress_loop, environment)
    if _runs_users(environment):
        runner.register_message("collab_room", _on_room)
        runner.register_message("collab_go", _on_go)
        if cfg.model_url and cfg.post_rate > 0:
            S.probe = gevent.spawn(_probe_loop, environment)


@events.report_to_master.add_listener
def _report(client_id: str, data: dict[str, Any], **_kw: Any) -> None:
    data["collab_live"] = dict(S.live)


@events.worker_report.add_listener
def _worker_report(client_id: str, data: dict[str, Any], **_kw: Any) -> None:
    if "collab_live" in data:
        S.live_by_node[client_id] = data["collab_live"]


@events.quitting.add_listener
def _quitting(environment: Environment, **_kw: Any) -> None:
    if _is_coordinator(environment) and not S.written:
        S.phase = "stopped"
        _write_result(environment, complete=False)  # a run cut short (-t, Ctrl-C): what there is


# --- the user -------------------------------------------------------------------------------


def _ask(environment: Environment, msg_type: str, data: dict[str, Any]) -> None:
    _runner(environment).send_message(msg_type, data)


class RoomUser(User):
    """All the members of one room."""

    def _claim(self) -> int | None:
        req = f"{_node()}:{id(self)}"
        result: gevent.event.AsyncResult = gevent.event.AsyncResult()
        S.claims[req] = result
        _ask(self.environment, "collab_claim", {"req": req})
        room: int | None = result.get(timeout=60)
        return room

    @task
    def play_room(self) -> None:
        cfg = _config(self.environment)
        index = self._claim()
        if index is None:
            raise StopUser()
        mine = Collector()
        run = RoomRun(cfg, cfg.rooms[index], mine, self.environment.events.request.fire, S.live)
        try:
            run.login()
            run.connect()
            _ask(self.environment, "collab_ready", {"room": index})
            try:
                go_wall = S.go.get(timeout=cfg.go_timeout_s)
            except gevent.Timeout:
                mine.error("run.no_go")
                go_wall = time.time()
            if S.cpu_start is None:
                S.cpu_start = (time.process_time(), time.time())
            go_at = time.perf_counter() + (go_wall - time.time())
            run.go_wall = go_wall
            run.run(go_at)
            mine.window = [go_wall, go_wall + cfg.duration_s]
            run.drain()
        except Exception as exc:  # a bug in one room must not hang the run
            log.exception("collab: room %s failed", run.slug)
            mine.error(f"run.crashed.{type(exc).__name__}")
        finally:
            run.close()
            mine.rooms_done = 1
            if S.cpu_start is not None:
                mine.cpu[_node()] = [time.process_time() - S.cpu_start[0], time.time() - S.cpu_start[1]]
            mine.merge(S.collector)  # this process's model probes so far
            S.collector = Collector()
            _ask(self.environment, "collab_done", {"room": index, "collector": mine.to_json()})
        raise StopUser()
