"""``python manage.py loadtest --scenario NAME [--json FILE]`` (docs/wire.md).

Starts what the scenario needs on loopback (the simulated model, Daphne with the
scenario's settings -- ``--processes N`` of them, each room on one (``--route hash``) or
its members spread over them (``--route spread``) -- and a private Redis when the layer needs one), seeds accounts, runs
the Locust simulated users headless, stops everything it started, and prints a table
(with a progress line while it runs). ``--target URL --credentials FILE`` runs the
users against a server elsewhere instead, starting nothing. See docs/loadtest.md.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from collab.loadtest.report import draw_chart, table
from collab.loadtest.runner import Options, run
from collab.loadtest.scenarios import MCP_AGENT_SCRIPT, SCENARIOS


def _levels(value: str) -> list[int]:
    try:
        levels = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise CommandError(f"--rooms wants numbers like 4,8,16, not {value!r}") from None
    if not levels or min(levels) < 1:
        raise CommandError("--rooms wants positive numbers")
    return levels


class Command(BaseCommand):
    help = "Run a load-test scenario end to end and report (WIRE.md, 'Load test report')."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--scenario", choices=sorted(SCENARIOS), help="what to run")
        parser.add_argument("--json", default="", help="write the report here")
        parser.add_argument("--chart", default="", help="draw latency against load here (PNG)")
        parser.add_argument(
            "--plot", nargs="+", default=[], metavar="REPORT", help="only draw --chart from these reports"
        )
        parser.add_argument("--target", default="", help="a running server's URL: start nothing")
        parser.add_argument("--credentials", default="", help="with --target: seed_loadtest's JSON")
        parser.add_argument("--model-url", default="", help="with --target: the model (…/v1) for TTFT probes")
        parser.add_argument("--server-pid", type=int, default=0, help="with --target: measure this process")
        parser.add_argument("--duration", type=float, help="seconds of posting per load level")
        parser.add_argument("--rooms", help="rooms per level; a list (4,8,16) makes a sweep")
        parser.add_argument("--sockets", help="idle: sockets per level, a list")
        parser.add_argument("--members", type=int, help="members per room")
        parser.add_argument(
            "--storm", choices=("server", "redis"), default="server", help="storm: restart the server or Redis"
        )
        parser.add_argument("--storm-after", type=float, default=2.0, help="storm: seconds from posting to the restart")
        parser.add_argument("--storm-drain", type=float, default=2.0, help="storm: the old server's drain (s)")
        parser.add_argument("--storm-share", type=float, help="storm: share of rooms streaming a reply at the restart")
        parser.add_argument("--offered", type=float, help="replies in flight per room, on average")
        parser.add_argument("--tps", type=float, help="the model's tokens/s")
        parser.add_argument("--ttft-ms", type=float, help="the model's time to first token")
        parser.add_argument("--reply-tokens", type=int, help="tokens per reply")
        parser.add_argument("--runs", type=int, help="posts per room, one after another (not Poisson)")
        parser.add_argument(
            "--mcp",
            choices=["http", "stdio"],
            help="agents: the tools are an MCP server's, started by the run (Streamable HTTP on loopback,"
            " or a stdio child per call)",
        )
        parser.add_argument("--tick-ms", type=float, help="the simulator's write tick")
        parser.add_argument("--coalesce-ms", type=float, help="COLLAB_COALESCE_MS for the server")
        parser.add_argument("--layer", choices=["memory", "pubsub", "core"], help="the channel layer")
        parser.add_argument(
            "--redis",
            default="start",
            help="'start' a private redis-server (default), 'env' ($REDIS_URL, else the local one) or a"
            " redis:// URL; implies a Redis layer",
        )
        parser.add_argument("--login", choices=["http", "session"], help="how members get their session")
        parser.add_argument("--workers", type=int, help="load-generator (Locust) processes (0: one, the local runner)")
        parser.add_argument(
            "--processes",
            type=int,
            help="Daphne server processes to start (default 1), rooms placed on them by --route;"
            " 2 or more need a Redis layer",
        )
        parser.add_argument(
            "--route",
            choices=["hash", "spread"],
            help="with --processes 2 or more: 'hash' (default) puts each room's members on the process its"
            " socket's path hashes to, as deploy/nginx.conf does; 'spread' puts member i on process i mod N",
        )
        parser.add_argument("--database-url", default="", help="PostgreSQL instead of a throwaway SQLite")
        parser.add_argument("--keep", default="", help="keep logs and files in this folder")
        parser.add_argument("--locust-csv", default="", help="Locust's CSV files, with this prefix")
        parser.add_argument("--no-warmup", action="store_true", help="skip the warm-up post")
        parser.add_argument("--all-levels", action="store_true", help="a sweep runs every level")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--asgi-app", default="collab.asgi:application", help="what Daphne serves (a profiling wrapper)"
        )

    def handle(self, *args: Any, **o: Any) -> None:
        if o["plot"]:
            if not o["chart"]:
                raise CommandError("--plot needs --chart FILE.png")
            reports = [json.loads(Path(p).read_text()) for p in o["plot"]]
            draw_chart(reports, o["chart"])
            self.stdout.write(f"chart -> {o['chart']}")
            return
        if not o["scenario"]:
            raise CommandError("--scenario is required")
        if bool(o["target"]) != bool(o["credentials"]):
            raise CommandError("--target and --credentials go together")
        sc = dataclasses.replace(SCENARIOS[o["scenario"]])
        overrides = {
            "duration": "duration_s",
            "members": "members",
            "offered": "offered",
            "tps": "tps",
            "ttft_ms": "ttft_ms",
            "reply_tokens": "reply_tokens",
            "tick_ms": "tick_ms",
            "coalesce_ms": "coalesce_ms",
            "layer": "layer",
            "login": "login",
            "workers": "workers",
            "processes": "processes",
            "route": "route",
            "runs": "runs",
        }
        for opt, field in overrides.items():
            if o[opt] is not None:
                setattr(sc, field, o[opt])
        if o["redis"] != "start" and sc.layer == "memory" and o["layer"] is None:
            sc.layer = "pubsub"
        if sc.processes < 1:
            raise CommandError("--processes wants 1 or more")
        if sc.processes > 1:
            if o["target"]:
                raise CommandError("--processes starts server processes: not with --target (nothing is started)")
            if o["layer"] == "memory":
                raise CommandError(
                    f"--processes {sc.processes} needs a Redis channel layer (--layer pubsub or core):"
                    " the in-memory layer does not reach across processes"
                )
            if sc.layer == "memory":
                sc.layer = "pubsub"
                self.stdout.write(f"--processes {sc.processes}: the Redis pub/sub layer (processes share rooms)")
        if o["mcp"]:
            if not sc.agent_script:
                raise CommandError("--mcp is for the agents scenario (its agents call the MCP server's tools)")
            if o["target"]:
                raise CommandError("--mcp starts and registers an MCP server: not with --target (nothing is started)")
            sc.mcp, sc.agent_script = o["mcp"], MCP_AGENT_SCRIPT
        if o["storm_share"] is not None:
            sc.storm_share = o["storm_share"]
        if o["rooms"]:
            if sc.idle:
                raise CommandError("idle takes --sockets, not --rooms")
            sc.levels = _levels(o["rooms"])
        if o["sockets"]:
            if not sc.idle:
                raise CommandError("--sockets is for the idle scenario")
            sc.levels = _levels(o["sockets"])
        if o["all_levels"]:
            sc.stop_at_knee = False
        opts = Options(
            scenario=sc,
            target=o["target"],
            credentials=o["credentials"],
            model_url=o["model_url"],
            server_pid=o["server_pid"],
            redis=o["redis"],
            database_url=o["database_url"],
            workdir=o["keep"],
            warmup=not o["no_warmup"],
            locust_csv=o["locust_csv"],
            seed=o["seed"],
            interactive=sys.stdout.isatty(),
            asgi_app=o["asgi_app"],
            storm=o["storm"],
            storm_after_s=o["storm_after"],
            storm_drain_s=o["storm_drain"],
        )
        self.stdout.write(f"{sc.name}: {sc.summary}")

        def say(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        try:
            report = run(opts, say)
        except KeyboardInterrupt:
            raise CommandError("interrupted: every process it started is stopped") from None
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc
        steps = report.get("steps") or [report]
        self.stdout.write("\n" + table(steps) + "\n(times in ms; conc. replies: offered (measured mean))")
        if "knee" in report:
            self.stdout.write(f"knee: {report['knee']}")
        if "idle" in report:
            self.stdout.write(f"idle: {report['idle']}")
        if o["json"]:
            Path(o["json"]).write_text(json.dumps(report, indent=1))
            self.stdout.write(f"report -> {o['json']}")
        if o["chart"]:
            draw_chart([report], o["chart"])
            self.stdout.write(f"chart -> {o['chart']}")
