"""Continuing a reply cut off at the token limit (finish_reason "length"): one click,
a regenerate that continues (docs/wire.md, "continue")."""

from __future__ import annotations

from collab.chat.errors import ClientError


async def continue_reply(user_id: int, room_id: int, message_id: object) -> None:
    raise ClientError("action.unknown", "Not available yet.")
