"""Create (idempotently) rooms, member accounts and assistants for tests, demos and load
tests, and write the credentials as JSON (docs/wire.md)."""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path
from typing import Any

from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from collab.chat.models import Assistant, McpServer, Membership, Room
from collab.chat.services import mcp_catalog, providers

MCP_SERVER = "loadmcp"  # the load test's MCP server (collab/loadtest/mcp_server.py; docs/loadtest.md)


class Command(BaseCommand):
    help = "Create R rooms x U member accounts with A assistants each; write their credentials as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rooms", type=int, required=True)
        parser.add_argument("--users-per-room", type=int, required=True)
        parser.add_argument("--assistants", type=int, required=True)
        parser.add_argument("--output", required=True, help="JSON file to write ('-' for stdout)")
        parser.add_argument("--prefix", default="load", help="name prefix of rooms, users and assistants")
        parser.add_argument("--password", default="", help="one password for all (default: random)")
        parser.add_argument("--agents", action="store_true", help="the assistants are agents (is_agent)")
        parser.add_argument(
            "--mcp",
            default="",
            help="register the load test's MCP server (a Streamable HTTP URL, or 'stdio' to run "
            "collab.loadtest.mcp_server per call) and attach its tools to the assistants",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        rooms, users, assistants = opts["rooms"], opts["users_per_room"], opts["assistants"]
        if not (0 < rooms <= 10_000 and 0 < users <= 10_000 and 0 <= assistants <= 50):
            raise CommandError("need 1-10000 rooms, 1-10000 users per room and 0-50 assistants")
        prefix: str = opts["prefix"]
        if not prefix.isalnum():
            raise CommandError("--prefix must be letters and digits")
        data = self.seed(prefix, rooms, users, assistants, opts["password"], opts["agents"])
        if opts["mcp"]:
            self.register_mcp(opts["mcp"], prefix)
        text = json.dumps(data, indent=1)
        if opts["output"] == "-":
            self.stdout.write(text)
        else:
            Path(opts["output"]).write_text(text)
            self.stderr.write(f"seeded {rooms} rooms x {users} users, {assistants} assistants -> {opts['output']}")

    @transaction.atomic
    def seed(
        self, prefix: str, n_rooms: int, n_users: int, n_assistants: int, password: str, agents: bool = False
    ) -> dict[str, Any]:
        default = providers.ensure_default_assistant()  # the default provider follows the environment
        bots = []
        for i in range(1, n_assistants + 1):
            bot, _ = Assistant.objects.update_or_create(
                handle=f"{prefix}bot{i}",
                defaults={"display_name": f"Bot {i}", "provider": default.provider, "model": "", "is_agent": agents},
            )
            bots.append(bot)
        # One password for every account, hashed once: PBKDF2 per account would make a
        # 400-member seed take minutes. Re-running the seed sets the new password on all.
        secret = password or secrets.token_urlsafe(12)
        hashed = make_password(secret)
        out = []
        for r in range(1, n_rooms + 1):
            slug = f"{prefix}-room-{r}"
            names = [f"{prefix}-r{r}-u{u}" for u in range(1, n_users + 1)]
            existing = set(User.objects.filter(username__in=names).values_list("username", flat=True))
            User.objects.bulk_create([User(username=n, password=hashed) for n in names if n not in existing])
            User.objects.filter(username__in=names).update(password=hashed)
            users = list(User.objects.filter(username__in=names).order_by("id"))
            members = [(u, secret) for u in users]
            room = Room.objects.filter(slug=slug).first()
            if room is None:
                room = Room.objects.create(name=f"Load room {r}", slug=slug, owner=members[0][0])
            for user, _ in members:
                role = Membership.Role.OWNER if user.pk == room.owner_id else Membership.Role.MEMBER
                Membership.objects.get_or_create(room=room, user=user, defaults={"role": role})
            room.assistants.set(bots)
            for bot in bots:  # granted-only, as every new assistant: these rooms may use them
                bot.granted_rooms.add(room)
            out.append(
                {
                    "slug": slug,
                    "users": [{"username": u.username, "password": p} for u, p in members],
                    "assistants": [b.handle for b in bots],
                }
            )
        return {"rooms": out}

    def register_mcp(self, where: str, prefix: str) -> None:
        """The load test's MCP server, its tools listed now and attached to the seeded assistants."""
        if where == "stdio":
            fields = {
                "transport": "stdio",
                "command": sys.executable,
                "args": ["-m", "collab.loadtest.mcp_server", "--stdio"],
            }
        else:
            fields = {"transport": "http", "url": where, "command": "", "args": []}
        server, _ = McpServer.objects.update_or_create(
            name=MCP_SERVER, defaults={**fields, "enabled": True, "timeout_s": 30.0}
        )
        server.full_clean()  # stdio needs COLLAB_MCP_STDIO=1; a loopback URL, its network allowed
        listing = mcp_catalog.refresh(server)
        if listing.error or not listing.tools:
            raise CommandError(str(listing))
        tools = list(server.tools.filter(schema_error=""))
        for bot in Assistant.objects.filter(handle__startswith=f"{prefix}bot"):
            bot.mcp_tools.add(*tools)
        self.stderr.write(f"MCP server {server.name}: {listing}")
