"""A room's own frames, apart from its messages: its header (status banner, name) and its
member list, whole or as the entries whose presence changed (docs/wire.md). Templates
only, as everything rendered (rendering.py)."""

from __future__ import annotations

from collections.abc import Sequence

from django.template.loader import get_template

from collab.chat import frames
from collab.chat.events import RoomFrame
from collab.chat.models import Room
from collab.chat.rendering import budget

_members = get_template("chat/_members.html")
_presence = get_template("chat/_presence.html")
_room_status = get_template("chat/_room_status.html")
_room_name = get_template("chat/_room_name.html")


def room_status(status: str, oob: bool = True) -> str:
    """The room's status banner (locked, archived; empty when open)."""
    return _room_status.render({"status": status, "oob": oob}).strip()


def frame_room_status(room: Room) -> RoomFrame:
    return frames.other(room_status(room.status))


def room_name(name: str, oob: bool = True) -> str:
    """The room's name: its page's heading, and (oob) its title."""
    return _room_name.render({"name": name, "oob": oob}).strip()


def frame_room_name(name: str) -> RoomFrame:
    return frames.other(room_name(name))


def members_listed(members: Sequence[dict[str, object]]) -> tuple[list[dict[str, object]], int]:
    """At most MEMBERS_LISTED members, online ones first, in their order; and how many
    more there are."""
    cap = budget("MEMBERS_LISTED")
    if len(members) <= cap:
        return list(members), 0
    keep = {id(p) for p in sorted(members, key=lambda p: not p["online"])[:cap]}
    return [p for p in members if id(p) in keep], len(members) - cap


def frame_members(members: Sequence[dict[str, object]]) -> str:
    listed, more = members_listed(members)
    return _members.render({"members": listed, "more": more, "oob": True}).strip()


def frame_presence(members: Sequence[dict[str, object]]) -> str:
    """Members whose presence changed: each one's entry of the list, swapped in by its id."""
    return _presence.render({"members": members}).strip() if members else ""
