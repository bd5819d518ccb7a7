"""Rooms and their members: create, join, leave, remove, settings; who is online.

Every change is announced after its transaction commits: the member list to the room,
the end of a membership to that user's sockets (on every process).
"""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.utils.text import slugify

from collab.chat import broadcast, frames, room_frames, shared
from collab.chat.errors import ClientError
from collab.chat.events import MembershipEnded, RoomFrame
from collab.chat.models import Assistant, Ban, Membership, Room, new_invite_token
from collab.chat.services import availability
from collab.chat.services.providers import ensure_default_assistant

MemberRow = tuple[int, str, str]  # user id, username, role


def member_rows(room_id: int) -> list[MemberRow]:
    """The room's members, owners first (database thread)."""
    rows = (
        Membership.objects.filter(room_id=room_id)
        .order_by("-role", "user__username")
        .values_list("user_id", "user__username", "role")
    )
    return list(rows)


def members_with(rows: list[MemberRow], online: set[int] | None) -> list[dict[str, object]]:
    """The member list's entries; `online` marks those with the room open."""
    return [
        {"user_id": user_id, "username": username, "role": role, "online": online is not None and user_id in online}
        for user_id, username, role in rows
    ]


def members_of(room_id: int, online: set[int] | None = None) -> list[dict[str, object]]:
    """The room's members, owners first; `online` marks those with the room open."""
    return members_with(member_rows(room_id), online)


def _members_frame(room_id: int, online: set[int]) -> RoomFrame:
    return frames.other(room_frames.frame_members(members_of(room_id, online)))


async def announce_members(room_id: int, by: str = "") -> None:
    """The member list, with who is online, to the room; `by`: the socket that changed
    it (it is not sent the frame: its own snapshot already shows it)."""
    online = await shared.backend().online(room_id)
    html = await database_sync_to_async(lambda: room_frames.frame_members(members_of(room_id, online)))()
    await broadcast.to_room(room_id, frames.other(html, by=by))


def announce_members_on_commit(room_id: int) -> None:
    # Read once committed: the list as the change left it.
    broadcast.after_commit_with(room_id, lambda: _members_frame(room_id, shared.online_sync(room_id)))


def allocate_seqs(room_id: int, count: int, open_only: bool = False) -> int:
    """Reserve `count` consecutive seqs in the room; return the first. Must run inside the
    caller's transaction: the row lock (PostgreSQL) or the write lock (SQLite) taken by
    the UPDATE serialises concurrent posts until commit, so none share or skip a seq.
    `open_only`: only in an open room (a post, a regeneration); this update is the check
    that holds when the room was locked after the caller read it open."""
    # One round trip: UPDATE ... RETURNING (SQLite 3.35+, PostgreSQL), the ORM has no such update.
    table, status = Room._meta.db_table, " AND status = %s" if open_only else ""
    params: list[int | str] = [count, room_id, *([Room.Status.OPEN.value] if open_only else [])]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET last_seq = last_seq + %s WHERE id = %s{status} RETURNING last_seq",
            params,
        )
        row = cursor.fetchone()
    if row is None:
        check_open(Room.objects.only("status").get(pk=room_id))  # raises room.locked or room.archived
        raise ClientError("room.locked", "The room was locked and opened again as you posted; send it again.")
    return int(row[0]) - count + 1


def check_open(room: Room) -> None:
    """Posts (and regenerations) only in an open room; reading goes on."""
    if room.status == Room.Status.LOCKED:
        raise ClientError("room.locked", "This room is locked: nobody can post for now.")
    if room.status == Room.Status.ARCHIVED:
        raise ClientError("room.archived", "This room is archived: it is read-only.")


async def take_token(bucket: str, burst: float, refill_s: float, nothing_done: str, too_fast: str) -> None:
    """One token of a rate bucket in the shared state, shared by every server process; the
    errors say what was not done (`server.unavailable`) and what was too fast (`rate.limited`)."""
    try:
        taken = await shared.backend().take(bucket, burst, refill_s)
    except shared.UNAVAILABLE:
        raise ClientError(
            "server.unavailable", f"The server cannot reach its shared state just now; {nothing_done}"
        ) from None
    if not taken:
        raise ClientError("rate.limited", f"You are {too_fast} too fast; wait a moment.")


async def take_post_token(user_id: int, room_id: int) -> None:
    """The posting rate, per member and room."""
    burst, refill = float(settings.COLLAB["POST_BURST"]), settings.COLLAB["POST_REFILL_S"]
    await take_token(f"post:{user_id}:{room_id}", burst, refill, "nothing was sent. Try again.", "sending messages")


# --- presence (every process: shared.backend()) ---------------------------------------------


async def socket_opened(room_id: int, user_id: int, socket: str) -> None:
    if await shared.backend().join(room_id, user_id, socket):
        await announce_members(room_id, by=socket)


async def socket_closed(room_id: int, user_id: int, socket: str) -> None:
    if await shared.backend().leave(room_id, user_id, socket):
        await announce_members(room_id)


# --- rooms and members (views) ----------------------------------------------------------------


def check_room_name(name: str, topic: str) -> tuple[str, str]:
    name, topic = name.strip(), topic.strip()
    if not name:
        raise ClientError("room.name_required", "A room needs a name.")
    if len(name) > 100:
        raise ClientError("room.name_too_long", "A room name is at most 100 characters.")
    if len(topic) > 500:
        raise ClientError("room.topic_too_long", "A topic is at most 500 characters.")
    if not slugify(name):
        raise ClientError("room.name_invalid", "A room name needs at least one letter or digit.")
    return name, topic


def _create(owner: User, name: str, slug: str, topic: str, reply_to_all: bool, assistant: Assistant) -> Room:
    with transaction.atomic():
        room = Room.objects.create(name=name, slug=slug, topic=topic, owner=owner, reply_to_all=reply_to_all)
        Membership.objects.create(room=room, user=owner, role=Membership.Role.OWNER)
        room.assistants.add(assistant)
        return room


def create_room(owner: User, name: str, topic: str = "", reply_to_all: bool = False) -> Room:
    name, topic = check_room_name(name, topic)
    base = slugify(name)[:100]
    default_assistant = ensure_default_assistant()
    for attempt in range(50):
        slug = base if attempt == 0 else f"{base}-{attempt + 1}"
        try:
            return _create(owner, name, slug, topic, reply_to_all, default_assistant)
        except IntegrityError:
            continue
    return _create(owner, name, f"{base}-{uuid.uuid4().hex[:8]}", topic, reply_to_all, default_assistant)


def join_by_invite(user: User, token: str) -> Room:
    room = Room.objects.filter(invite_token=token).first()
    if room is None:
        raise ClientError("invite.invalid", "This invite link is not valid (it may have been reset).")
    join_room(user, room)
    return room


def join_room(user: User, room: Room) -> None:
    """Become a member: by an invite link, or staff who were viewing the room read-only
    (their own explicit act). Never a banned user, never an archived room. Under the
    room's row lock, which a ban and a status change take too: neither slips in between
    the check and the join."""
    with transaction.atomic():
        status = Room.objects.select_for_update().values_list("status", flat=True).get(pk=room.pk)
        if Ban.objects.filter(room=room, user=user).exists():
            raise ClientError(
                "room.banned", "You have been banned from this room; an invite link cannot let you back in."
            )
        if status == Room.Status.ARCHIVED:
            raise ClientError("room.archived", "This room is archived: nobody can join it.")
        _, created = Membership.objects.get_or_create(room=room, user=user)
        if created:
            announce_members_on_commit(room.id)


def leave_room(user: User, room: Room) -> None:
    if room.owner_id == user.pk:
        raise ClientError("room.owner_cannot_leave", "The owner cannot leave; delete the room instead.")
    remove_member(room, user, reason="left")


def remove_member(room: Room, user: User, reason: str) -> bool:
    """End a membership; the user's open sockets in that room close, on every process.
    False when there was none to end. Ended whatever the channel layer does: if it is
    away, the sockets are not told, but every action of theirs is refused from now on."""
    deleted, _ = Membership.objects.filter(room=room, user=user).exclude(role=Membership.Role.OWNER).delete()
    if not deleted:
        return False
    ended: MembershipEnded = {"type": "membership.ended", "room_id": room.id, "reason": reason}
    broadcast.to_user_after_commit(user.pk, ended)
    announce_members_on_commit(room.id)
    return True


def reset_invite(room: Room) -> None:
    room.invite_token = new_invite_token()
    room.save(update_fields=["invite_token"])


def update_room(
    room: Room, *, topic: str, reply_to_all: bool, assistant_ids: list[int], system_prompt: str | None = None
) -> None:
    _, topic = check_room_name(room.name, topic)
    fields = ["topic", "reply_to_all"]
    if system_prompt is not None:  # the room's own prompt: every assistant's next reply has it (context.py)
        if len(system_prompt.strip()) > 4000:
            raise ClientError("room.prompt_too_long", "A room system prompt is at most 4,000 characters.")
        room.system_prompt = system_prompt.strip()
        fields.append("system_prompt")
    with transaction.atomic():
        # Only what the room may use (services/availability.py); one attached earlier that
        # staff have not granted it stays attached, inert, for staff to grant again.
        may_use = availability.attachable(room)
        chosen = set(may_use.filter(pk__in=assistant_ids).values_list("pk", flat=True))
        if refused := sorted(set(assistant_ids) - chosen):
            raise ClientError("assistant.unavailable", f"Assistant {refused[0]} is not available to this room.")
        inert = set(room.assistants.exclude(pk__in=may_use.values("pk")).values_list("pk", flat=True))
        room.topic = topic
        room.reply_to_all = reply_to_all
        room.save(update_fields=fields)
        room.assistants.set(Assistant.objects.filter(pk__in=chosen | inert))


def is_staff(user: Any) -> bool:
    """Staff (the admin's users) may view any room read-only without joining it."""
    return bool(getattr(user, "is_authenticated", False) and user.is_active and user.is_staff)


class SocketRoom(NamedTuple):
    room_id: int
    slug: str
    read_only: bool  # staff who are not members: they see the room live and may do nothing in it


def room_for_socket(user: Any, slug: str) -> SocketRoom | None:
    """The room when `user` may connect to its socket, else None: members, and staff who
    are not members (read-only)."""
    if not getattr(user, "is_authenticated", False):
        return None
    row = Membership.objects.filter(room__slug=slug, user_id=user.pk).values_list("room_id", "room__slug").first()
    if row is not None:
        return SocketRoom(row[0], row[1], read_only=False)
    if is_staff(user):
        found = Room.objects.filter(slug=slug).exclude(bans__user_id=user.pk).values_list("pk", "slug").first()
        if found is not None:
            return SocketRoom(found[0], found[1], read_only=True)
    return None
