"""`manage.py refresh_mcp_tools [--every SECONDS] [--all]`: list the enabled MCP servers' tools and
store them (services/mcp_catalog.py; docs/architecture/agents.md, "MCP servers").

Once, or with `--every`, again and again until stopped: `serve` starts it so
(COLLAB_MCP_REFRESH_S), a cron job or a systemd timer may run it once. A server that fails
keeps the tools listed before and says why (in the admin, and here); the others go on.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections

from collab.chat.services import mcp_catalog


class Command(BaseCommand):
    help = "List the enabled MCP servers' tools and store them (once, or --every SECONDS)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--every", type=float, default=0.0, help=f"repeat every SECONDS (serve: {settings.COLLAB_MCP_REFRESH_S:g})"
        )
        parser.add_argument("--all", action="store_true", help="the disabled servers too")

    def handle(self, *args: Any, **opts: Any) -> None:
        every: float = opts["every"]
        if every < 0:
            raise CommandError("--every wants 0 (once) or more seconds")
        stop = threading.Event()
        while True:
            started = time.monotonic()
            for listing in mcp_catalog.refresh_all(enabled_only=not opts["all"]):
                (self.stderr if listing.error else self.stdout).write(str(listing))
            if every <= 0:
                return
            close_old_connections()  # a long-lived loop: no connection kept across sleeps
            # The schedule itself: nothing to wait on but the clock (a stop ends the process).
            stop.wait(max(0.0, every - (time.monotonic() - started)))
