"""Who is here and who is typing (docs/wire.md, "typing")."""

from __future__ import annotations

from collab.chat.errors import ClientError


async def typing(user_id: int, room_id: int, channel_name: str) -> None:
    raise ClientError("action.unknown", "Not available yet.")
