"""Parsing a client's WebSocket frame (docs/wire.md, "Client to server"): one JSON
object per action. Pure: no database, no channel layer; every bad frame is a
ClientError with its code."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from collab.chat.errors import ClientError

ACTIONS = (
    "post",
    "stop",
    "regenerate",
    "continue",
    "typing",
    "lens",
    "share",
    "edit",
    "delete",
    "vote",
    "merge",
    "kick",
    "ban",
    "unban",
    "lock",
    "unlock",
    "stop_all",
)


def parse_frame(text_data: str | None) -> tuple[str, dict[str, Any]]:
    """(action, fields) of one client frame; `post` when the frame names no action."""
    if not text_data:
        raise ClientError("frame.malformed", "Send JSON text frames.")
    if len(text_data) > settings.COLLAB["MAX_FRAME_BYTES"]:
        raise ClientError("frame.too_large", "That frame is too large.")
    try:
        content = json.loads(text_data)
    except (ValueError, RecursionError):
        raise ClientError("frame.malformed", "That frame is not valid JSON.") from None
    if not isinstance(content, dict):
        raise ClientError("frame.malformed", "A frame is a JSON object.")
    action = content.get("action") or "post"
    if not isinstance(action, str) or action not in ACTIONS:
        raise ClientError("action.unknown", f"Unknown action {str(action)[:40]!r}.")
    return action, content
