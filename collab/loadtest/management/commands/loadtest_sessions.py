"""``python manage.py loadtest_sessions --credentials SEED.json --output FILE``

Part of seeding a load test on the server being tested: open a session for each seeded
account, as a login would, and write the seed JSON again with a ``session`` (the
``sessionid`` cookie) beside each password. A login costs ~0.4 s of server CPU (PBKDF2):
a sweep over hundreds of members would spend minutes logging in before every run. The
simulated users use the cookie when there is one and log in over HTTP otherwise.

Needs the server's own settings (the same DJANGO_SECRET_KEY and database): the
``loadtest`` command runs it with the environment it gives Daphne.
"""

from __future__ import annotations

import json
from importlib import import_module
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

_BACKEND = "django.contrib.auth.backends.ModelBackend"


class Command(BaseCommand):
    help = "Open a session for every account of a seed_loadtest JSON; write it with the cookies."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--credentials", required=True, help="seed_loadtest's JSON")
        parser.add_argument("--output", required=True, help="where to write it with sessions")

    def handle(self, *args: Any, **opts: Any) -> None:
        data = json.loads(Path(opts["credentials"]).read_text())
        names = [u["username"] for room in data["rooms"] for u in room["users"]]
        users = {u.get_username(): u for u in get_user_model().objects.filter(username__in=names)}
        missing = sorted(set(names) - set(users))
        if missing:
            raise CommandError(f"{len(missing)} accounts do not exist, e.g. {missing[0]}: seed first")
        store = import_module(settings.SESSION_ENGINE).SessionStore
        for room in data["rooms"]:
            for entry in room["users"]:
                user = users[entry["username"]]
                session = store()
                session[SESSION_KEY] = user._meta.pk.value_to_string(user)
                session[BACKEND_SESSION_KEY] = _BACKEND
                session[HASH_SESSION_KEY] = user.get_session_auth_hash()
                session.create()
                entry["session"] = session.session_key
        Path(opts["output"]).write_text(json.dumps(data, indent=1))
        self.stderr.write(f"opened {len(names)} sessions -> {opts['output']}")
