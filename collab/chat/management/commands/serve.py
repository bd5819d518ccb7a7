"""`make run`: everything needed to try collab on one machine, in one command.

Starts the model endpoint when none is configured (SmolLM2-135M-Instruct through
llama.cpp, see collab/llm/local.py; or the simulated model with `--model simulated`),
migrates, creates a demo account and room, starts Daphne, prints the address and login,
and stops every process it started on Ctrl-C. A process of its own that dies ends it.

`--workers N` (N >= 2) starts N Daphne processes on the ports after --port, sharing Redis
(REDIS_URL, required) and the database, with nginx in front on --port configured from
deploy/nginx.conf (or no proxy: `--no-proxy`). See collab/deploy.py and README "Deploying".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from collab import deploy
from collab.chat.models import Assistant, Room
from collab.chat.services import providers, rooms
from collab.chat.shared.sharded import split_urls
from collab.deploy import STAGE_MODEL, STAGE_PROXY, STAGE_WEB, Children
from collab.llm import local

DEMO_USER = "demo"
DEMO_ROOM = "demo"


def _answers(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(response.status < 500)
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except OSError:
        return False


SIMULATED_MODEL = "simulated"


def name_the_simulated_model() -> None:
    """`--model simulated` stands the simulated model where the embedded one would be: it is
    named so, not as SmolLM2 (replies and the room page say which model wrote; provider_env.
    is_embedded_model), unless COLLAB_LLM_MODEL names one. The processes started here
    inherit the name."""
    endpoint = providers.default_endpoint_settings()
    if not settings.COLLAB_LLM_MODEL and endpoint["base_url"] == settings.COLLAB_LOCAL_MODEL_URL:
        os.environ["COLLAB_LLM_MODEL"] = settings.COLLAB_LLM_MODEL = SIMULATED_MODEL


class Command(BaseCommand):
    help = "Run collab with its embedded defaults: model endpoint, database, demo room, Daphne."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument(
            "--workers",
            type=int,
            default=1,
            help="Daphne processes. 1 (the default) serves on --port itself; N >= 2 listen on "
            "127.0.0.1, ports --port+1 .. --port+N, behind nginx on --port, and need REDIS_URL",
        )
        parser.add_argument(
            "--no-proxy",
            action="store_true",
            help="with --workers N: start the workers (on --host) without nginx, and print their addresses",
        )
        parser.add_argument("--demo-password", default=os.environ.get("COLLAB_DEMO_PASSWORD", "collab-demo"))
        parser.add_argument(
            "--model",
            choices=["local", "simulated"],
            default="local",
            help="the model to start when no endpoint is configured: SmolLM2 through llama.cpp "
            "(local, the default) or the simulated model (simulated, where llama.cpp cannot be built)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        workers, no_proxy = opts["workers"], opts["no_proxy"]
        if workers < 1:
            raise CommandError("--workers must be 1 or more")
        if no_proxy and workers == 1:
            raise CommandError("--no-proxy goes with --workers N (N >= 2): one worker is served on --port itself")
        nginx = self.check_workers(opts) if workers > 1 else None
        children = Children()

        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        signal.signal(signal.SIGHUP, lambda *_: sys.exit(0))
        # Ctrl-C stops everything even when whoever started serve ignored SIGINT (a script's
        # background job, a test runner): a process that starts with SIGINT ignored keeps
        # it so, and Python then installs no handler of its own.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # Every process started here signs with this one's key (manage.py took the one kept
        # in .cache/secret_key if DJANGO_SECRET_KEY was unset), and speaks plain http.
        os.environ.setdefault("DJANGO_SECRET_KEY", settings.SECRET_KEY)
        os.environ.setdefault("COLLAB_HTTPS", "0")
        key_file = deploy.local_state_dir() / "secret_key"
        if key_file.is_file() and key_file.read_text().strip() == settings.SECRET_KEY:
            self.stdout.write(f"Sessions are signed with the key kept in {key_file} (DJANGO_SECRET_KEY unset).")
        if opts["model"] == "simulated":
            name_the_simulated_model()
        try:
            self.start_model(children, opts["model"])
            self.stdout.write("Preparing the database ...")
            call_command("migrate", interactive=False, verbosity=0)
            self.demo(opts["demo_password"])
            self.schedule_mcp_listing(children)
            if settings.STORAGES["default"]["BACKEND"].endswith("FileSystemStorage"):
                Path(settings.MEDIA_ROOT).mkdir(parents=True, exist_ok=True)  # members' files (COLLAB_MEDIA_ROOT)
            self.schedule_upload_sweep(children)
            if workers == 1:
                url = self.start_one(children, opts["host"], opts["port"])
            else:
                url = self.start_many(children, opts, nginx)
            self.stdout.write(
                self.style.SUCCESS(
                    f"{url}"
                    f"  log in as {DEMO_USER} / {opts['demo_password']}, open the room '{DEMO_ROOM}',\n"
                    f"  and write '@assistant what is 2+2?'.  Ctrl-C stops everything.\n"
                )
            )
            raise CommandError(f"{children.watch()}; stopping everything")
        except KeyboardInterrupt:
            self.stdout.write("\nstopping ...")
        finally:
            if any(c.stage == STAGE_WEB and c.proc.poll() is None for c in children.all):
                self.stdout.write(
                    f"(Daphne finishes the replies in flight: up to {deploy.worker_stop_grace():.0f} s; "
                    "Ctrl-C again to kill it)"
                )
            children.stop(self.stdout.write)

    def start_one(self, children: Children, host: str, port: int) -> str:
        """Today's `make run`: one Daphne on --port, no proxy."""
        daphne = children.start(deploy.daphne_command(host, port), "Daphne", STAGE_WEB, deploy.worker_stop_grace())
        url = f"http://{host}:{port}"
        self.wait_for(f"{url}/healthz", daphne, "Daphne")
        return f"\ncollab is running at {url}/\n"

    def schedule_mcp_listing(self, children: Children) -> None:
        """The MCP servers' tools, listed again every COLLAB_MCP_REFRESH_S (docs/architecture/agents.md,
        "MCP servers"): one small process for the deployment, not one per worker."""
        every = settings.COLLAB_MCP_REFRESH_S
        if every <= 0:
            return
        command = [sys.executable, "manage.py", "refresh_mcp_tools", "--every", f"{every:g}"]
        children.start(command, "the MCP tools' listing", STAGE_MODEL, cwd=settings.BASE_DIR)

    def schedule_upload_sweep(self, children: Children) -> None:
        """Uploads never posted, deleted once COLLAB["ORPHAN_UPLOAD_HOURS"] old, looked for every
        COLLAB_SWEEP_UPLOADS_S (docs/architecture/files.md, "Clean-up"): one process for the deployment."""
        every = settings.COLLAB_SWEEP_UPLOADS_S
        if every <= 0:
            return
        command = [sys.executable, "manage.py", "sweep_uploads", "--every", f"{every:g}"]
        children.start(command, "the sweep of uploads never posted", STAGE_MODEL, cwd=settings.BASE_DIR)

    def check_workers(self, opts: dict[str, Any]) -> str | None:
        """Everything --workers N needs, checked before anything starts; the nginx binary."""
        workers, host, port = opts["workers"], opts["host"], opts["port"]
        if not settings.REDIS_URL:
            raise CommandError(
                f"--workers {workers} needs Redis: set REDIS_URL (e.g. REDIS_URL=redis://127.0.0.1:6379/0). "
                "The in-memory channel layer lives inside one process: members on different "
                "workers would not see each other's messages."
            )
        for url in split_urls(settings.REDIS_URL):  # every shard (docs/architecture.md#a-sharding)
            problem = deploy.redis_answers(url)
            if problem:
                raise CommandError(f"Redis does not answer at {url}: {problem}")
        if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
            self.stdout.write(
                self.style.WARNING(
                    f"{workers} workers on SQLite ({settings.DATABASES['default']['NAME']}): it works on one "
                    "machine (WAL, one write at a time), but PostgreSQL (DATABASE_URL) is the production choice."
                )
            )
        nginx = None
        if not opts["no_proxy"]:
            nginx = deploy.find_nginx()
            if nginx is None:
                raise CommandError(deploy.NGINX_MISSING.format(n=workers))
        wanted = [(host, port)] if nginx else []
        wanted += [(self.worker_host(opts), p) for p in deploy.worker_ports(port, workers)]
        for h, p in wanted:
            if not deploy.port_free(h, p):
                raise CommandError(f"port {p} on {h} is in use (an earlier serve?); choose another --port")
        return nginx

    @staticmethod
    def worker_host(opts: dict[str, Any]) -> str:
        # Behind nginx the workers listen on loopback only; alone, where --host says.
        return str(opts["host"]) if opts["no_proxy"] else "127.0.0.1"

    def start_many(self, children: Children, opts: dict[str, Any], nginx: str | None) -> str:
        host, port, workers = opts["host"], opts["port"], opts["workers"]
        worker_host = self.worker_host(opts)
        ports = deploy.worker_ports(port, workers)
        self.stdout.write(f"Starting {workers} Daphne workers on {worker_host}:{ports[0]}..{ports[-1]} ...")
        started = [
            children.start(
                deploy.daphne_command(worker_host, p, behind_proxy=nginx is not None),
                f"Daphne worker {i} (port {p})",
                STAGE_WEB,
                deploy.worker_stop_grace(),
            )
            for i, p in enumerate(ports, 1)
        ]
        urls = [f"http://{worker_host}:{p}" for p in ports]
        for i, (proc, url) in enumerate(zip(started, urls, strict=True), 1):
            self.wait_for(f"{url}/healthz", proc, f"Daphne worker {i}")
        listed = "\n".join(f"    {url}/" for url in urls)
        if nginx is None:
            return f"\ncollab is running on {workers} Daphne workers (no proxy; deploy/nginx.conf is one):\n{listed}\n"
        state = deploy.nginx_state_dir(port)
        try:
            conf = deploy.write_nginx_config(state, host, port, ports)
        except ValueError as exc:
            raise CommandError(f"{deploy.NGINX_SITE}: {exc}") from exc
        self.stdout.write(f"Starting nginx on {host}:{port} ({conf}) ...")
        proxy = children.start(deploy.nginx_command(nginx, conf), "nginx", STAGE_PROXY)
        url = f"http://{host}:{port}"
        self.wait_for(f"{url}/healthz", proxy, "nginx")
        logs = Path(os.path.relpath(state, settings.BASE_DIR))
        return (
            f"\ncollab is running at {url}/  (nginx, logs in {logs}/)\n"
            f"  in front of {workers} Daphne workers (pages in turn, each room's sockets on one by hash):\n{listed}\n"
        )

    def start_model(self, children: Children, model: str) -> None:
        endpoint = providers.default_endpoint_settings()
        if endpoint["base_url"] != settings.COLLAB_LOCAL_MODEL_URL:
            self.stdout.write(f"Model endpoint: {endpoint['base_url']} (model {endpoint['default_model']})")
            return
        models_url = endpoint["base_url"].rstrip("/") + "/models"
        if _answers(models_url):
            self.stdout.write(f"Model endpoint: {endpoint['base_url']} (already running)")
            return
        parsed = urlparse(endpoint["base_url"])
        host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
        if model == "simulated":
            self.stdout.write(f"Starting the simulated model on {host}:{port} ...")
            command = [
                sys.executable, "manage.py", "simulate_model", "--host", host, "--port", str(port),
                "--tps", "80", "--ttft-ms", "150",
            ]  # fmt: skip
            proc = children.start(command, "the simulated model", STAGE_MODEL, cwd=settings.BASE_DIR)
            self.wait_for(models_url, proc, "the simulated model")
            return
        try:
            if not local.llama_installed():
                raise local.LocalModelError(
                    "llama-cpp-python is not installed in this environment. `make run` installs it "
                    "(pip install -e '.[local]': a build of about 6 minutes, once); where it cannot be "
                    "built, `make run MODEL=simulated` runs on the simulated model"
                )
            child = local.start_server(host, port, log=self.stdout.write)
            name = f"the llama.cpp server ({local.MODEL_TITLE}; log {local.log_file(port)})"
            children.add(child, name, STAGE_MODEL)
            self.stdout.write(f"Starting {local.MODEL_TITLE} (llama.cpp) on {host}:{port} ...")
            local.wait_ready(endpoint["base_url"], child, port)
        except local.LocalModelError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"Model endpoint: {endpoint['base_url']} ({local.MODEL_TITLE} through llama.cpp, "
            f"log in {local.log_file(port)})"
        )

    def wait_for(self, url: str, child: subprocess.Popen[bytes], what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not _answers(url):
            if child.poll() is not None:
                raise CommandError(f"{what} exited with code {child.returncode}")
            if time.monotonic() > deadline:
                raise CommandError(f"{what} did not answer at {url} within {timeout:.0f} s")
            time.sleep(0.2)  # polling a process we just started; no event to wait on

    def demo(self, password: str) -> None:
        user = User.objects.filter(username=DEMO_USER).first()
        if user is None:
            user = User.objects.create_user(DEMO_USER, password=password)
        elif not user.check_password(password):
            user.set_password(password)
            user.save(update_fields=["password"])
        if not Room.objects.filter(slug=DEMO_ROOM).exists():
            room = rooms.create_room(user, "Demo", topic="Try @assistant here, or @agent for a run with tools")
            default = providers.ensure_default_assistant()
            agent, _ = Assistant.objects.get_or_create(  # README, "Agents"
                handle="agent",
                defaults={"display_name": "Agent", "provider": default.provider, "is_agent": True,
                          "temperature": default.temperature},
            )  # fmt: skip
            agent.granted_rooms.add(room)  # granted-only, as every new assistant: this room may use it
            room.assistants.add(agent)
        else:
            providers.ensure_default_assistant()
