"""Editing and deleting one's own message, broadcast to the room."""

from __future__ import annotations

from collab.chat.errors import ClientError


async def edit_message(user_id: int, room_id: int, message_id: object, text: object) -> None:
    raise ClientError("action.unknown", "Not available yet.")


async def delete_message(user_id: int, room_id: int, message_id: object) -> None:
    raise ClientError("action.unknown", "Not available yet.")
