"""Replies streaming anywhere in the deployment: stop one, or every one of a room, on
whichever process runs it (the generation registry here, a control event to the others)."""

from __future__ import annotations

from collab.chat import broadcast, shared
from collab.chat.generation import registry


async def stop_running(message_id: int) -> bool:
    """Stop a reply on whichever process runs it, without asking who may (the caller has:
    the stop command, or moderation.stop_reply for staff). False when no process runs it
    any more (its process died): the caller ends it (replies.interrupt), or leaves it to
    the sweep."""
    if registry.stop(message_id):
        return True
    if await shared.backend().leased([message_id]):
        await broadcast.to_processes({"type": "reply.stop", "message_id": message_id, "reason": "stopped"})
        return True
    return False


async def stop_all(room_id: int) -> None:
    """Stop every reply of a room, on every process."""
    for reply_id in registry.in_room(room_id):
        registry.stop(reply_id)
    await broadcast.to_processes({"type": "room.stop_all", "room_id": room_id})
