"""A socket follows its account (issue 33, "sockets follow the account"): deactivating a
user, deleting them, changing their password or deleting their session closes their
sockets (`session.ended`, then 4403), and a frame from a socket whose account changed
while nobody told it is refused, with nothing stored. The session that changed the
password itself (Django's update_session_auth_hash) stays. Across two real processes:
tests/test_multiprocess.py::test_deactivating_a_user_closes_their_sockets_on_every_process."""

from __future__ import annotations

import asyncio
from importlib import import_module

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session

from collab.chat.models import Message
from tests.conftest import Member, World, connected, session_cookie


async def closed_with(m: Member, code: str) -> int:
    """Read until the server closes the socket: its close code; `code` was the last error."""
    async with asyncio.timeout(10):
        while True:
            out = await m.comm.receive_output(10)
            if out["type"] == "websocket.close":
                assert m.frames.errors and m.frames.errors[-1][0] == code, m.frames.errors
                return int(out.get("code", 1000))
            m.raw.append(out["text"])
            m.frames.feed(out["text"], 0.0)


async def test_deactivating_deleting_or_a_new_password_closes_the_users_sockets(world: World) -> None:
    async with connected(world.bob, "lab") as (ok, _, bob), connected(world.alice, "lab") as (ok2, _, alice):
        assert ok and ok2
        await bob.until(lambda f: f.snapshots >= 1)
        await alice.until(lambda f: f.snapshots >= 1)

        def deactivate() -> None:
            world.bob.is_active = False
            world.bob.save()

        await database_sync_to_async(deactivate)()
        assert await closed_with(bob, "session.ended") == 4403
        await alice.send(action="typing")  # alice's socket is not touched: it still acts
        await alice.assert_silent()

    dora_user = await database_sync_to_async(User.objects.create_user)("dora", password="pw-dora-123")

    def join() -> None:
        world.room.memberships.create(user=dora_user)

    await database_sync_to_async(join)()
    async with connected(dora_user, "lab") as (ok, _, dora):
        assert ok
        await dora.until(lambda f: f.snapshots >= 1)

        def new_password() -> None:
            dora_user.set_password("a-new-one-456")
            dora_user.save()

        await database_sync_to_async(new_password)()
        assert await closed_with(dora, "session.ended") == 4403
    async with connected(dora_user, "lab") as (ok, _, dora):  # dora logs in again, and is then deleted
        assert ok
        await dora.until(lambda f: f.snapshots >= 1)
        await database_sync_to_async(dora_user.delete)()
        assert await closed_with(dora, "session.ended") == 4403


async def test_deleting_the_session_closes_its_sockets(world: World) -> None:
    cookie = await database_sync_to_async(session_cookie)(world.bob)
    async with connected(world.bob, "lab", cookie=cookie) as (ok, _, bob):
        assert ok
        await bob.until(lambda f: f.snapshots >= 1)
        # A post seen back: the socket's session watch (it reads the session's expiry on
        # the same database thread, queued at connect) has run, and found the session.
        await bob.post("before")
        await bob.until(lambda f: any("before" in frame for frame in bob.raw))
        await database_sync_to_async(Session.objects.filter(session_key=cookie).delete)()
        assert await closed_with(bob, "session.ended") == 4403


async def test_a_frame_from_a_socket_whose_account_changed_unseen_is_refused(world: World) -> None:
    """The account changed without a signal (a queryset update: nobody told the sockets):
    the next action is checked against the account as stored, refused, and the socket
    closes; nothing is stored."""
    async with connected(world.bob, "lab") as (ok, _, bob):
        assert ok
        await bob.until(lambda f: f.snapshots >= 1)
        await database_sync_to_async(User.objects.filter(pk=world.bob.pk).update)(password="pbkdf2_sha256$1$x$y")
        await bob.post("am I still here?")
        assert await closed_with(bob, "session.ended") == 4403
    assert not await database_sync_to_async(Message.objects.filter(text="am I still here?").exists)()


async def test_the_session_that_changed_the_password_stays(world: World) -> None:
    cookie = await database_sync_to_async(session_cookie)(world.bob)
    async with connected(world.bob, "lab", cookie=cookie) as (ok, _, bob):
        assert ok
        await bob.until(lambda f: f.snapshots >= 1)

        def change_in_this_session() -> None:  # what Django's password change view does
            world.bob.set_password("bobs-new-pw-789")
            world.bob.save()
            store = import_module(settings.SESSION_ENGINE).SessionStore(cookie)
            store[HASH_SESSION_KEY] = world.bob.get_session_auth_hash()
            store.save()

        await database_sync_to_async(change_in_this_session)()
        await bob.post("still me")
        await bob.until(lambda f: any("still me" in frame for frame in bob.raw))
        assert not bob.frames.errors
