"""A session that ends (logout) closes its open sockets, on every process."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.signals import user_logged_out
from django.dispatch import receiver
from django.http import HttpRequest

from collab.chat import broadcast


@receiver(user_logged_out)
def close_the_sessions_sockets(sender: Any, request: HttpRequest, user: Any, **kwargs: Any) -> None:
    # Sent before Django flushes the session: its key still names the sockets to close.
    session_key = request.session.session_key
    if user is not None and session_key:
        broadcast.to_user_sync(user.pk, {"type": "session.ended", "session_key": session_key})
