"""A session that ends (logout, or expiry) closes its open sockets, on every process."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth.signals import user_logged_out
from django.dispatch import receiver
from django.http import HttpRequest
from django.utils import timezone

from collab.chat import broadcast


@receiver(user_logged_out)
def close_the_sessions_sockets(sender: Any, request: HttpRequest, user: Any, **kwargs: Any) -> None:
    # Sent before Django flushes the session: its key still names the sockets to close.
    session_key = request.session.session_key
    if user is not None and session_key:
        broadcast.to_user_sync(user.pk, {"type": "session.ended", "session_key": session_key})


def session_seconds_left(session_key: str | None) -> float | None:
    """Seconds until the session expires, as the database has it now (it may have been
    renewed, or ended: then 0); None without a session store that keeps expiry dates."""
    if not session_key:
        return None
    engine = import_module(settings.SESSION_ENGINE)
    store = engine.SessionStore(session_key)
    if not hasattr(store, "get_model_class"):  # not a database-backed store
        return None
    row = store.get_model_class().objects.filter(session_key=session_key).values("expire_date").first()
    if row is None:
        return 0.0
    return max(0.0, (row["expire_date"] - timezone.now()).total_seconds())
