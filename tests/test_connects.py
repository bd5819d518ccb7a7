"""Connects that cost little (issue 38; docs/architecture.md#a-connects):
the session, the user and their membership in two queries on one trip to the database
thread (collab/chat/socket_auth.py), a room's shared snapshot part read once for the
sockets that connect while nothing changed (services/snapshot_cache.py), and who came
and went told as changes, one frame per room per interval (services/presence.py). Over
real processes: tests/test_personal_cluster.py (a shared snapshot and personal replies)."""

from __future__ import annotations

from importlib import import_module
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from collab.chat import metrics, socket_auth
from collab.chat.models import Ban, Membership
from collab.chat.services import presence
from collab.loadtest.wire import member_list
from tests.conftest import World, member, session_cookie


def _store(user: User) -> object:
    return import_module(settings.SESSION_ENGINE).SessionStore(session_cookie(user))


def test_a_members_socket_is_admitted_in_two_queries(world: World) -> None:
    store = _store(world.bob)
    with CaptureQueriesContext(connection) as queries:
        found = socket_auth.admit(store, "lab")  # type: ignore[arg-type]
    assert found is not None and len(queries) == 2
    assert (found.user_id, found.username, found.room_id, found.read_only) == (
        world.bob.pk,
        "bob",
        world.room.pk,
        False,
    )
    assert found.session_left is not None and found.session_left > 3600  # the session row's own expiry


def test_who_is_not_admitted(world: World) -> None:
    assert socket_auth.admit(_store(world.carol), "lab") is None  # not a member  # type: ignore[arg-type]
    assert socket_auth.admit(_store(world.bob), "nowhere") is None  # type: ignore[arg-type]
    staff = User.objects.create_user("sam", password="pw-sam-12345", is_staff=True)
    found = socket_auth.admit(_store(staff), "lab")  # type: ignore[arg-type]
    assert found is not None and found.read_only  # staff who are not members: read-only
    Ban.objects.create(room=world.room, user=staff)
    assert socket_auth.admit(_store(staff), "lab") is None  # type: ignore[arg-type]
    store = _store(world.bob)
    world.bob.is_active = False
    world.bob.save()
    assert socket_auth.admit(store, "lab") is None  # type: ignore[arg-type]


def test_a_session_whose_password_changed_is_refused_and_ended(world: World) -> None:
    store = _store(world.bob)
    world.bob.set_password("a-new-password-123")
    world.bob.save()
    assert socket_auth.admit(store, "lab") is None  # type: ignore[arg-type]
    assert not type(store)().exists(store.session_key)  # type: ignore[attr-defined]  # flushed, as Channels does


def test_an_expired_or_unknown_session_is_refused(world: World) -> None:
    store = import_module(settings.SESSION_ENGINE).SessionStore("not-a-session-key-at-all")
    assert socket_auth.admit(store, "lab") is None


@pytest.mark.usefixtures("memory_layer", "replies_idle")
async def test_sockets_that_connect_while_nothing_changed_share_one_read(world: World) -> None:
    reads = metrics.SNAPSHOT_READS.labels("read")
    shared = metrics.SNAPSHOT_READS.labels("shared")
    async with member(world.alice) as alice:
        read_before, shared_before = reads._value.get(), shared._value.get()
        async with member(world.bob), member(world.alice), member(world.bob):
            assert (reads._value.get() - read_before, shared._value.get() - shared_before) == (0, 3)
        await alice.post("something changed")
        await alice.until(lambda f: any(r.role == "user" for r in f.replies.values()))
        async with member(world.bob) as bob:  # read again: the post moved the room on
            assert reads._value.get() - read_before == 1
            assert any("something changed" in raw for raw in bob.raw)


@pytest.mark.usefixtures("memory_layer", "replies_idle")
async def test_comings_and_goings_are_told_together_as_changes(world: World, settings: Any) -> None:
    carol = world.carol
    await Membership.objects.acreate(room=world.room, user=carol)
    settings.COLLAB = {**settings.COLLAB, "PRESENCE_MS": 600_000}  # held until flushed below
    async with member(world.alice) as alice:
        await presence.flush()  # her own coming, told
        await alice.until(lambda f: len(alice.raw) > 1)
        seen = len(alice.raw)
        async with member(world.bob), member(carol):
            assert not any('id="member-' in raw for raw in alice.raw[seen:])  # not a list per connect
            await presence.flush()  # the interval's end: one frame for both
            await alice.until(lambda f: _shown(alice.raw).get("carol") is True)
            changes = [raw for raw in alice.raw[seen:] if 'id="member-' in raw]
            assert len(changes) == 1 and '<ul id="members"' not in changes[0]
            assert _shown(alice.raw) == {"alice": True, "bob": True, "carol": True}
            assert f'<li id="member-{world.alice.pk}"' not in changes[0]  # only who changed
        await presence.flush()
        await alice.until(lambda f: _shown(alice.raw) == {"alice": True, "bob": False, "carol": False})


def _shown(raw: list[str]) -> dict[str, bool]:
    shown: dict[str, bool] = {}
    for frame in raw:
        shown = member_list(shown, frame) or shown
    return shown
