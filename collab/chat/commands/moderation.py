"""A moderator's actions over the room's socket (docs/wire.md, "Roles"): `kick`, `ban`,
`unban`, `lock`, `unlock`, `stop_all`. Each is the service the settings page and the
admin use too (services/moderation.py: its checks, its audit row, its announcements)."""

from __future__ import annotations

from collab.chat.commands.registry import Ctx, command, raw
from collab.chat.services import moderation


def _reason(value: object) -> str:
    return value if isinstance(value, str) else ""


@command("kick", params={"username": raw}, power="kick")
async def kick(ctx: Ctx, username: object) -> None:
    await ctx.store(lambda a: moderation.kick(a.actor, a.room, username))


@command("ban", params={"username": raw, "reason": _reason}, power="kick")
async def ban(ctx: Ctx, username: object, reason: str) -> None:
    await ctx.store(lambda a: moderation.ban(a.actor, a.room, username, reason))


@command("unban", params={"username": raw}, power="kick")
async def unban(ctx: Ctx, username: object) -> None:
    await ctx.store(lambda a: moderation.unban(a.actor, a.room, username))


@command("lock", power="lock")
async def lock(ctx: Ctx) -> None:
    await ctx.store(lambda a: moderation.lock(a.actor, a.room))


@command("unlock", power="lock")
async def unlock(ctx: Ctx) -> None:
    await ctx.store(lambda a: moderation.unlock(a.actor, a.room))


@command("stop_all", power="stop_all")
async def stop_all(ctx: Ctx) -> None:
    await ctx.store(lambda a: moderation.stop_all(a.actor, a.room))
