"""Personal lenses and the replies made for each member (`/each`), and sharing them."""

from __future__ import annotations

from collab.chat.errors import ClientError


async def set_lens(user_id: int, room_id: int, text: object) -> None:
    raise ClientError("action.unknown", "Not available yet.")


async def share(user_id: int, room_id: int, message_id: object) -> None:
    raise ClientError("action.unknown", "Not available yet.")
