"""Votes on assistants' replies, and what they decide (docs/wire.md, "vote")."""

from __future__ import annotations

from collab.chat.errors import ClientError


async def vote(user_id: int, room_id: int, message_id: object, value: object) -> None:
    raise ClientError("action.unknown", "Not available yet.")
