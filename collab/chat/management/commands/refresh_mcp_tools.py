"""`manage.py refresh_mcp_tools [--every SECONDS] [--all]`: list the enabled MCP servers' tools and
store them (services/mcp_catalog.py; docs/architecture/agents.md, "MCP servers").

Once, or with `--every`, again and again until stopped: `serve` starts it so
(COLLAB_MCP_REFRESH_S), a cron job or a systemd timer may run it once. A server that fails
keeps the tools listed before and says why (in the admin, and here); the others go on.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from collab.chat.management import schedule
from collab.chat.services import mcp_catalog


class Command(BaseCommand):
    help = "List the enabled MCP servers' tools and store them (once, or --every SECONDS)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--every", type=float, default=0.0, help=f"repeat every SECONDS (serve: {settings.COLLAB_MCP_REFRESH_S:g})"
        )
        parser.add_argument("--all", action="store_true", help="the disabled servers too")

    def handle(self, *args: Any, **opts: Any) -> None:
        def job() -> None:
            for listing in mcp_catalog.refresh_all(enabled_only=not opts["all"]):
                (self.stderr if listing.error else self.stdout).write(str(listing))

        schedule.every(opts["every"], job)
