"""`make run`: everything needed to try collab on one machine, in one command.

Starts the model endpoint when none is configured (SmolLM2-135M-Instruct through
llama.cpp, see collab/llm/local.py; or the simulated model with `--model simulated`),
migrates, creates a demo account and room, starts Daphne, prints the address and login,
and stops every process it started on Ctrl-C. A process of its own that dies ends it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from collab.chat import services
from collab.chat.models import Room
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


class Command(BaseCommand):
    help = "Run collab with its embedded defaults: model endpoint, database, demo room, Daphne."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--demo-password", default=os.environ.get("COLLAB_DEMO_PASSWORD", "collab-demo"))
        parser.add_argument(
            "--model",
            choices=["local", "simulated"],
            default="local",
            help="the model to start when no endpoint is configured: SmolLM2 through llama.cpp "
            "(local, the default) or the simulated model (simulated, where llama.cpp cannot be built)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        children: list[subprocess.Popen[bytes]] = []
        self.names: dict[int, str] = {}  # pid -> what it is, for the message when one dies

        def stop(*_: object) -> None:
            for child in reversed(children):
                if child.poll() is None:
                    child.terminate()
            for child in reversed(children):
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()

        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            self.start_model(children, opts["model"])
            self.stdout.write("Preparing the database ...")
            call_command("migrate", interactive=False, verbosity=0)
            self.demo(opts["demo_password"])
            daphne = [
                sys.executable, "-m", "daphne", "-b", opts["host"], "-p", str(opts["port"]),
                # A socket left open a day must not be closed with 1000: htmx's ws
                # extension does not reconnect after a normal close.
                "--websocket_timeout", "-1",
                "collab.asgi:application",
            ]  # fmt: skip
            children.append(subprocess.Popen(daphne))
            self.names[children[-1].pid] = "Daphne"
            url = f"http://{opts['host']}:{opts['port']}"
            self.wait_for(f"{url}/healthz", children[-1], "Daphne")
            self.stdout.write(
                self.style.SUCCESS(
                    f"\ncollab is running at {url}/\n"
                    f"  log in as {DEMO_USER} / {opts['demo_password']}, open the room '{DEMO_ROOM}',\n"
                    f"  and write '@assistant what is 2+2?'.  Ctrl-C stops everything.\n"
                )
            )
            self.watch(children)
        except KeyboardInterrupt:
            self.stdout.write("\nstopping ...")
        finally:
            stop()

    def start_model(self, children: list[subprocess.Popen[bytes]], model: str) -> None:
        endpoint = services.default_endpoint_settings()
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
            children.append(subprocess.Popen(command, cwd=settings.BASE_DIR))
            self.names[children[-1].pid] = "the simulated model"
            self.wait_for(models_url, children[-1], "the simulated model")
            return
        try:
            if not local.llama_installed():
                raise local.LocalModelError(
                    "llama-cpp-python is not installed in this environment. `make run` installs it "
                    "(pip install -e '.[local]': a build of about 6 minutes, once); where it cannot be "
                    "built, `make run MODEL=simulated` runs on the simulated model"
                )
            child = local.start_server(host, port, log=self.stdout.write)
            children.append(child)
            self.names[child.pid] = f"the llama.cpp server ({local.MODEL_TITLE}; log {local.log_file(port)})"
            self.stdout.write(f"Starting {local.MODEL_TITLE} (llama.cpp) on {host}:{port} ...")
            local.wait_ready(endpoint["base_url"], child, port)
        except local.LocalModelError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"Model endpoint: {endpoint['base_url']} ({local.MODEL_TITLE} through llama.cpp, "
            f"log in {local.log_file(port)})"
        )

    def watch(self, children: list[subprocess.Popen[bytes]]) -> None:
        """Block until one of the children exits (Ctrl-C interrupts the wait), then fail,
        naming it: a dead model or Daphne leaves nothing worth keeping up."""
        while True:
            pid, status = os.wait()
            child = next((c for c in children if c.pid == pid), None)
            if child is None:
                continue  # not one of ours
            child.returncode = code = os.waitstatus_to_exitcode(status)
            how = f"exited with code {code}"
            if code < 0:
                how = f"was killed by signal {-code} ({signal.strsignal(-code)})"
            raise CommandError(f"{self.names.get(pid, 'a child process')} {how}; stopping everything")

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
            services.create_room(user, "Demo", topic="Try @assistant here")
        else:
            services.ensure_default_assistant()
