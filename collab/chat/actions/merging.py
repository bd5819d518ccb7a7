"""Merging the approved parallel answers to one message into one reply (docs/wire.md, "merge")."""

from __future__ import annotations

from collab.chat.errors import ClientError


async def merge(user_id: int, room_id: int, message_id: object, assistant: object) -> None:
    raise ClientError("action.unknown", "Not available yet.")
