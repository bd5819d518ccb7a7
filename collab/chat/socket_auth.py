"""Who a room socket is, and whether it may have the room: one trip to the database
thread, two queries (the session row; the user with their membership of the room).

Channels' AuthMiddleware read the session, then the user, and the consumer then read the
membership and the session's expiry again: four queries on four trips per connect, on
the one database thread every connect of a process shares
(docs/architecture.md#a-connects). The rules are Django's and Channels' own: the
session's backend must be one of AUTHENTICATION_BACKENDS, the user active, and the
session's auth hash must match the account's (else the session is flushed, as Channels
does).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, load_backend
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import User
from django.contrib.sessions.backends.base import SessionBase
from django.db import connection
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from collab.chat.models import Ban, Membership, Room
from collab.chat.services import rooms


class Admitted(NamedTuple):
    user_id: int
    username: str
    room_id: int
    slug: str
    read_only: bool  # staff who are not members (services/rooms.py, SocketRoom)
    auth_hash: str | None  # the session's auth hash: every action checks it (commands.Socket)
    session_left: float | None  # seconds until the session expires (None: a store without dates)


def _session(store: SessionBase) -> tuple[dict[str, Any], float | None]:
    """The session's data and the seconds it has left, in one query for a database store
    (db, cached_db); any other store through its own load()."""
    read = getattr(store, "_get_session_from_db", None)
    if read is None or not store.session_key:
        return dict(store.items()), None
    row = read()  # Django's own read: the key, not expired
    if row is None:
        return {}, None
    data: dict[str, Any] = store.decode(row.session_data)
    store._session_cache = data  # type: ignore[attr-defined]  # what load() would have kept
    return data, max(0.0, (row.expire_date - timezone.now()).total_seconds())


@functools.cache
def _with_room_sql(vendor: str) -> str:  # made once per database vendor
    q = connection.ops.quote_name
    user, room, member, ban = (q(m._meta.db_table) for m in (User, Room, Membership, Ban))
    in_room = f"WHERE x.{q('room_id')} = r.{q('id')} AND x.{q('user_id')} = u.{q('id')}"
    return (
        f"SELECT u.*, r.{q('id')} AS room_pk,"
        f" EXISTS (SELECT 1 FROM {member} x {in_room}) AS member,"
        f" EXISTS (SELECT 1 FROM {ban} x {in_room}) AS banned"
        f" FROM {user} u LEFT JOIN {room} r ON r.{q('slug')} = %s"
        f" WHERE u.{q('id')} = %s AND u.{q('is_active')}"
    )


def _with_room(user_id: Any, slug: str) -> User | None:
    """The active user, with the room (by slug: `room_pk`, None if there is none), whether
    they are a member and whether they are banned from it: one query. Written as SQL: the
    ORM spent more time composing it than the database answering it (the connect path,
    docs/architecture.md)."""
    return next(iter(User.objects.raw(_with_room_sql(connection.vendor), [slug, user_id])), None)


def admit(store: SessionBase, slug: str) -> Admitted | None:
    """The socket's user and room, or None: no valid session, or no access to the room
    (not a member, and not staff, or staff banned from it). Database thread."""
    data, left = _session(store)
    user_id, backend_path = data.get(SESSION_KEY), data.get(BACKEND_SESSION_KEY)
    if user_id is None or backend_path not in settings.AUTHENTICATION_BACKENDS:
        return None
    backend = load_backend(backend_path)
    pk = User._meta.pk.to_python(user_id)  # type: ignore[union-attr]
    if getattr(type(backend), "get_user", None) is ModelBackend.get_user:
        user = _with_room(pk, slug)
        found = None
        if user is not None and user.room_pk is not None:  # type: ignore[attr-defined]
            if user.member:  # type: ignore[attr-defined]
                found = rooms.SocketRoom(user.room_pk, slug, read_only=False)  # type: ignore[attr-defined]
            elif rooms.is_staff(user) and not user.banned:  # type: ignore[attr-defined]
                found = rooms.SocketRoom(user.room_pk, slug, read_only=True)  # type: ignore[attr-defined]
    else:  # another backend's own get_user, then the room as for any user
        get_user = getattr(backend, "get_user", None)
        user = get_user(pk) if get_user is not None else None
        found = rooms.room_for_socket(user, slug) if user is not None else None
    if user is None:
        return None
    session_hash = data.get(HASH_SESSION_KEY)
    if not (session_hash and constant_time_compare(session_hash, user.get_session_auth_hash())):
        store.flush()  # as Channels' get_user: a session whose account changed is ended
        return None
    if found is None:
        return None
    return Admitted(user.pk, user.get_username(), found.room_id, found.slug, found.read_only, session_hash, left)
