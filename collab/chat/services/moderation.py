"""Staff and moderator actions on a room: lock, unlock, archive, unarchive, close, stop
one reply or every reply, kick, ban, unban, change a role, rename. The only code that
writes the audit log.

Each action checks who may (`may`), changes the room in one transaction with its audit
row, and announces its effect after the commit, on every process: a kicked member's
sockets close (`membership.ended`), a closed room's sockets close (`room.closed`), a
room's status or name reaches its pages (a `room.frame`).

Who may what (docs/wire.md, "Roles"): staff (the admin) may everything; a room's owner
everything in the room; a moderator may lock, unlock, stop any reply, and kick, ban or
unban members (not the owner, nor another moderator); a member none of these.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NoReturn

from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.db import transaction

from collab.chat import broadcast, room_frames, shared
from collab.chat.errors import ClientError
from collab.chat.events import RoomClosed
from collab.chat.models import AuditEntry, Ban, Membership, Message, Room
from collab.chat.services import streams
from collab.chat.services.rooms import announce_members_on_commit, check_room_name, remove_member

Power = Literal["lock", "archive", "close", "stop_all", "kick", "roles", "rename"]
MODERATOR_POWERS: frozenset[Power] = frozenset({"lock", "stop_all", "kick"})
MAX_REASON = 500
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Actor:
    """Who acts, and from which address (the request's, or the socket's)."""

    user: User
    address: str | None = None

    @property
    def name(self) -> str:
        return self.user.get_username()


def role_in(room: Room, user: User) -> str | None:
    return Membership.objects.filter(room=room, user=user).values_list("role", flat=True).first()


def may(actor: Actor, room: Room, power: Power) -> bool:
    if actor.user.is_active and actor.user.is_staff and actor.user.has_perm("chat.change_room"):
        return True
    role = role_in(room, actor.user)
    if role == Membership.Role.OWNER:
        return True
    return role == Membership.Role.MODERATOR and power in MODERATOR_POWERS


def refuse(power: Power) -> NoReturn:
    who = "the room's owner" if power in ("archive", "close", "roles", "rename") else "moderators and the owner"
    raise ClientError("room.not_allowed", f"Only {who} can do that in this room.")


def _require(actor: Actor, room: Room, power: Power) -> None:
    if not may(actor, room, power):
        refuse(power)


def record(
    actor: Actor | None, action: str, room: Room | None = None, target: User | None = None, detail: str = ""
) -> AuditEntry:
    """One audit row. Call it inside the action's transaction: no action without its row."""
    return AuditEntry.objects.create(
        actor=actor.user if actor else None,
        actor_name=actor.name if actor else "system",
        action=action,
        room=room,
        room_name=room.slug if room else "",
        target=target,
        target_name=target.get_username() if target else "",
        detail=detail[:MAX_REASON],
        address=actor.address if actor else None,
    )


# --- the room's status ------------------------------------------------------------------------


def _set_status(actor: Actor, room: Room, status: str, action: str, only_from: str | None = None) -> bool:
    """True when the status changed (an action that changes nothing leaves no row);
    `only_from`: change it only from that status (unarchive leaves a locked room locked)."""
    with transaction.atomic():
        Room.objects.select_for_update().filter(pk=room.pk).exists()  # one change at a time, joins wait
        rows = Room.objects.filter(pk=room.pk).exclude(status=status)
        if only_from is not None:
            rows = rows.filter(status=only_from)
        changed = rows.update(status=status)
        if changed:
            record(actor, action, room)
        room.status = Room.objects.values_list("status", flat=True).get(pk=room.pk)
    if changed:
        frame = room_frames.frame_room_status(room)
        # Stored and audited whatever follows: with the layer away the pages learn it from
        # their next snapshot (robust: an on_commit failure is logged, not raised).
        broadcast.after_commit(room.pk, frame)
    return bool(changed)


def rename(actor: Actor, room: Room, name: str) -> bool:
    """The owner (or staff) renames the room: checked as a new room's name is, audited,
    and the new name reaches every open page (its heading and title). True when it changed."""
    _require(actor, room, "rename")
    name, _ = check_room_name(name, "")
    with transaction.atomic():
        before = Room.objects.select_for_update().values_list("name", flat=True).get(pk=room.pk)
        if before == name:
            return False
        Room.objects.filter(pk=room.pk).update(name=name)
        room.name = name
        renamed(actor, room, before)
    return True


def renamed(actor: Actor, room: Room, before: str) -> None:
    """`room` was renamed from `before` (here, or by staff in the admin's room form): one
    audit row, in the change's transaction, and the name to its pages once it commits."""
    record(actor, "rename", room, detail=f"{before} -> {room.name}")
    broadcast.after_commit(room.pk, room_frames.frame_room_name(room.name))


def lock(actor: Actor, room: Room) -> bool:
    """Members read; nobody posts (a post gets `room.locked`). Not an archived room."""
    _require(actor, room, "lock")
    if room.status == Room.Status.ARCHIVED:
        raise ClientError("room.archived", "This room is archived: unarchive it first.")
    return _set_status(actor, room, Room.Status.LOCKED, "lock")


def unlock(actor: Actor, room: Room) -> bool:
    _require(actor, room, "lock")
    if room.status == Room.Status.ARCHIVED:
        raise ClientError("room.archived", "This room is archived: unarchive it instead.")
    return _set_status(actor, room, Room.Status.OPEN, "unlock")


def archive(actor: Actor, room: Room) -> bool:
    """Read-only, and gone from its members' lists of rooms."""
    _require(actor, room, "archive")
    return _set_status(actor, room, Room.Status.ARCHIVED, "archive")


def unarchive(actor: Actor, room: Room) -> bool:
    _require(actor, room, "archive")
    return _set_status(actor, room, Room.Status.OPEN, "unarchive", only_from=Room.Status.ARCHIVED)


def close(actor: Actor, room: Room, reason: str = "") -> None:
    """Every open socket of the room, on every process, gets a notice and closes (4403)."""
    _require(actor, room, "close")
    event: RoomClosed = {"type": "room.closed", "room_id": room.pk, "reason": reason[:MAX_REASON]}
    _reach(lambda: broadcast.to_room_sync(room.pk, event))  # sent first: no row for a close that reached nobody
    with transaction.atomic():
        record(actor, "close", room, detail=reason)


def _reach(send: Callable[[], object]) -> None:
    """Send through the channel layer now; when it is away, the action is refused (nothing
    done, nothing recorded) with a clear error instead of a failure after the fact."""
    try:
        send()
    except shared.UNAVAILABLE:
        log.warning("a moderation action could not reach the channel layer", exc_info=True)
        raise ClientError(
            "server.unavailable", "The server cannot reach its other processes just now; nothing was done. Try again."
        ) from None


def delete(actor: Actor, room: Room) -> None:
    """Delete a room (staff, from the admin) with its messages; its open sockets, on every
    process, are told `room.closed` and close (4403). The audit row keeps its slug."""
    _require(actor, room, "close")
    room_id = room.pk
    _reach(lambda: async_to_sync(streams.stop_all)(room_id))  # its replies stop first (billed otherwise)
    event: RoomClosed = {"type": "room.closed", "room_id": room_id, "reason": "deleted"}
    with transaction.atomic():
        record(actor, "delete", room, detail=room.name)
        room.delete()
        broadcast.after_commit(room_id, event)


def stop_all(actor: Actor, room: Room) -> None:
    """Every streaming reply of the room stops, on whichever process runs it; each keeps
    the text it had."""
    _require(actor, room, "stop_all")
    _reach(lambda: async_to_sync(streams.stop_all)(room.pk))
    with transaction.atomic():
        record(actor, "stop_all", room)


def stop_reply(actor: Actor, room: Room, message_id: object) -> bool:
    """One streaming reply of the room stops, on whichever process runs it, keeping its
    text (staff, the owner or a moderator: any reply; its asker stops it over the socket).
    False when no process runs it any more (its process died): the sweep ends it
    `interrupted` within a lease (the admin's live page lists only replies that run)."""
    _require(actor, room, "stop_all")
    if isinstance(message_id, bool) or not isinstance(message_id, int):
        raise ClientError("message.invalid_id", "message_id must be a message number.")
    message = Message.objects.filter(pk=message_id, room=room, role=Message.Role.ASSISTANT).first()
    if message is None:
        raise ClientError("message.not_found", "There is no such reply in this room.")
    if message.status != Message.Status.STREAMING:
        raise ClientError("reply.not_streaming", "This reply has already ended.")
    with transaction.atomic():
        record(actor, "stop_reply", room, detail=f"reply {message.pk} ({message.author_name})")
    return bool(async_to_sync(streams.stop_running)(message.pk))


# --- members ------------------------------------------------------------------------------------


def _member_target(
    actor: Actor, room: Room, username: object, doing: str = "removed or banned", lock: bool = False
) -> Membership:
    """The membership an action targets; `lock`: hold its row until the transaction ends
    (two staff acting at once: the second finds the first's outcome)."""
    if not isinstance(username, str) or not username.strip():
        raise ClientError("member.invalid", "Name the member: a username.")
    rows = Membership.objects.select_related("user").filter(room=room, user__username=username.strip())
    target = (rows.select_for_update(of=("self",)) if lock else rows).first()
    if target is None:
        raise ClientError("member.not_found", f"{username.strip()[:150]} is not a member of this room.")
    if target.role == Membership.Role.OWNER:
        raise ClientError("member.is_owner", f"The room's owner cannot be {doing}.")
    if target.user_id == actor.user.pk:
        raise ClientError("member.is_self", "Use 'Leave room' to leave.")
    if target.role == Membership.Role.MODERATOR and not may(actor, room, "roles"):
        raise ClientError("room.not_allowed", "Only the room's owner can remove a moderator.")
    return target


def kick(actor: Actor, room: Room, username: object) -> User:
    """The membership ends; the member's sockets in the room get `room.removed` and close
    (4403), on every process. The invite link lets them back in (ban does not)."""
    _require(actor, room, "kick")
    with transaction.atomic():
        target = _member_target(actor, room, username, lock=True)
        if not remove_member(room, target.user, reason="removed"):  # gone meanwhile: another's kick
            raise ClientError("member.not_found", f"{target.user.get_username()} is not a member of this room.")
        record(actor, "kick", room, target.user)
    return target.user


def ban(actor: Actor, room: Room, username: object, reason: str = "") -> User:
    """A kick that also bars rejoining, even by invite link. A user who is not a member
    (left, or kicked earlier) can be banned too."""
    with transaction.atomic():
        Room.objects.select_for_update().filter(pk=room.pk).exists()  # a join racing this ban waits for it
        user = ban_target(actor, room, username)
        _, created = Ban.objects.get_or_create(
            room=room, user=user, defaults={"by": actor.user, "reason": reason[:MAX_REASON]}
        )
        if not created:
            raise ClientError("member.already_banned", f"{user.get_username()} is already banned from this room.")
        remove_member(room, user, reason="banned")
        record(actor, "ban", room, user, detail=reason)
    return user


def ban_target(actor: Actor, room: Room, username: object) -> User:
    """Who `ban` would bar, or the ClientError it would raise (the admin's form asks first)."""
    _require(actor, room, "kick")
    if not isinstance(username, str) or not username.strip():
        raise ClientError("member.invalid", "Name the member: a username.")
    if Membership.objects.filter(room=room, user__username=username.strip()).exists():
        user = _member_target(actor, room, username).user
    else:
        found = User.objects.filter(username=username.strip()).first()
        if found is None:  # the same answer as for a user who exists: usernames are not listed here
            raise ClientError("member.not_found", f"{username.strip()[:150]} is not a member of this room.")
        if found.pk == actor.user.pk:
            raise ClientError("member.is_self", "You cannot ban yourself.")
        user = found
    if Ban.objects.filter(room=room, user=user).exists():
        raise ClientError("member.already_banned", f"{user.get_username()} is already banned from this room.")
    return user


def unban(actor: Actor, room: Room, username: object) -> None:
    _require(actor, room, "kick")
    with transaction.atomic():
        found = Ban.objects.select_related("user").filter(room=room, user__username=str(username).strip()).first()
        if found is None:
            raise ClientError("member.not_banned", f"{str(username)[:150]} is not banned from this room.")
        found.delete()
        record(actor, "unban", room, found.user)


def set_role(actor: Actor, room: Room, username: object, role: object) -> None:
    """Make a member a moderator, or a moderator a member (owners only; the owner stays)."""
    _require(actor, room, "roles")
    if role not in (Membership.Role.MODERATOR, Membership.Role.MEMBER):
        raise ClientError("member.invalid_role", "A role is 'moderator' or 'member'.")
    with transaction.atomic():
        target = _member_target(actor, room, username, doing="given another role", lock=True)
        if target.role == role:
            return
        Membership.objects.filter(pk=target.pk).update(role=role)
        record(actor, "role", room, target.user, detail=f"{target.role} -> {role}")
    announce_members_on_commit(room.pk)


def is_banned(room: Room, user: User) -> bool:
    return Ban.objects.filter(room=room, user=user).exists()
