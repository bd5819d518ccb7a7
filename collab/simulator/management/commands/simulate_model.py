"""``python manage.py simulate_model --host H --port P --tps N --ttft-ms N [--seed S]``."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from collab.simulator.cli import add_arguments, config_from_options
from collab.simulator.server import serve


class Command(BaseCommand):
    help = "Serve an OpenAI-compatible simulated model (POST /v1/chat/completions, GET /v1/models)."
    requires_system_checks: list[str] = []  # needs neither the database nor the other apps

    def add_arguments(self, parser: ArgumentParser) -> None:
        add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        def announce(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        serve(config_from_options(options), options["host"], options["port"], announce=announce)
