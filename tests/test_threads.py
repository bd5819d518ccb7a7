"""Threads (docs/wire.md, "threads"): a post with `thread` goes to the thread of a top-level
message, out of the room's timeline, its snapshots and its assistants' history; an
assistant asked in a thread is sent the thread. Over real sockets (the consumer
in-process) against the simulated model; two real Daphne processes:
tests/test_threads_cluster.py; Chromium: tests/browser/test_threads_page.py."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from collab.chat.models import Membership, Message, Room
from collab.simulator.app import SimulatorApp
from tests.conftest import Member, World, all_final, member, stalling
from tests.test_history import exported
from tests.test_pins import put, refused
from tests.test_room import assert_integrity, slow

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("layer", "replies_idle")]


def line(raw: list[str], parent: int) -> str | None:
    """The last "N replies" line of `parent` this socket was sent (None: never)."""
    found = [m.group(0) for f in raw for m in re.finditer(rf'<div id="msg-{parent}-thread"[^>]*>.*?</div>', f, re.S)]
    return found[-1] if found else None


def thread_frames(raw: list[str], parent: int) -> list[str]:
    """The frames with new articles of `parent`'s thread (into the page's #thread-live)."""
    new = '<div id="thread-live" hx-swap-oob="beforeend">'
    return [f for f in raw if f.startswith(new) and f'data-thread="{parent}"' in f]


def snapshot_list(frame: str) -> str:
    """The room's list in a snapshot frame (its `#messages`), without what follows it."""
    assert frame.startswith('<div id="messages" hx-swap-oob="true"')
    return frame[: frame.index('<ul id="members"')]


def stored() -> dict[int, Message]:
    return {m.id: m for m in Message.objects.order_by("seq")}


astored = database_sync_to_async(stored)


def request_with(sim: tuple[str, SimulatorApp], words: str) -> list[dict[str, Any]]:
    """The messages of the last request the simulated model got whose last turn holds `words`."""
    for request in reversed(sim[1].recorded):
        if words in request["messages"][-1]["content"]:
            return list(request["messages"])
    raise AssertionError(f"no request ended with {words!r}")


async def post_in(m: Member, thread: int, text: str) -> None:
    await m.send(text=text, thread=thread, client_id=None)


async def test_a_thread_reply_and_its_assistant_stay_in_the_thread(world: World, sim: tuple[str, SimulatorApp]) -> None:
    parent = await database_sync_to_async(put)(world.room, "alice", "shall we ship the parser on friday?")
    await database_sync_to_async(put)(world.room, "bob", "unrelated: the coffee machine is broken")
    async with member(world.alice) as alice, member(world.bob) as bob:
        await post_in(bob, parent.pk, "@a what could go wrong with a friday release?")
        for m in (alice, bob):  # the thread's articles go to the whole room, into the thread's list
            await m.until(lambda f: all_final(f, 1))
            assert len(thread_frames(m.raw, parent.pk)) == 1
            assert 'data-replies="2"' in (line(m.raw, parent.pk) or "")  # the post and its reply
            assert not any(f.startswith('<div id="messages" hx-swap-oob="beforeend"') for f in m.raw)
        rows = await astored()
        question, reply = [r for r in rows.values() if r.thread_id == parent.pk]
        assert (question.role, reply.role, reply.reply_to_id) == ("user", "assistant", question.pk)
        assert rows[parent.pk].thread_replies == 2 and rows[parent.pk].thread_last_at is not None
        assert_integrity(bob.frames, rows)
    # Its history: the message the thread hangs on, then the thread; not the room's others.
    sent = request_with(sim, "friday release")
    said = [t["content"] for t in sent[1:]]
    assert said == ["alice: shall we ship the parser on friday?", "bob: @a what could go wrong with a friday release?"]
    # The room's next reply is not sent the thread.
    async with member(world.alice) as alice:
        assert f'data-thread="{parent.pk}"' not in snapshot_list(alice.raw[0])  # no thread message in the list
        assert 'data-replies="2"' in (line(alice.raw, parent.pk) or "")  # its line, in the parent's article
        await alice.post("@a and the coffee machine?")
        await alice.until(lambda f: all_final(f, 1))
    room_turns = [t["content"] for t in request_with(sim, "coffee machine?")[1:]]
    assert not any("friday release" in t for t in room_turns) and any(
        "coffee machine is broken" in t for t in room_turns
    )


async def test_a_thread_reply_to_a_thread_reply_goes_to_the_same_thread(world: World) -> None:
    parent = await database_sync_to_async(put)(world.room, "alice", "top")
    async with member(world.bob) as bob:
        await post_in(bob, parent.pk, "first")
        await bob.until(lambda f: len(thread_frames(bob.raw, parent.pk)) == 1)
        first = await database_sync_to_async(Message.objects.get)(text="first")
        await post_in(bob, first.pk, "second, on the first")  # one level deep: the same thread
        await bob.until(lambda f: len(thread_frames(bob.raw, parent.pk)) == 2)
    second = await database_sync_to_async(Message.objects.get)(text="second, on the first")
    assert second.thread_id == parent.pk
    assert 'data-replies="2"' in (line(bob.raw, parent.pk) or "")


async def test_forged_thread_posts_are_refused_and_store_nothing(world: World) -> None:
    def setup() -> tuple[Message, Message, Message, Message]:
        parent = put(world.room, "alice", "shared")
        personal = put(world.room, "a", "for bob alone", recipient=world.bob)
        gone = put(world.room, "bob", "", deleted_at=parent.created_at)
        other = Room.objects.create(name="Other", slug="other", owner=world.carol)
        Membership.objects.create(room=other, user=world.carol, role=Membership.Role.OWNER)
        elsewhere = put(other, "carol", "carol's room")
        return parent, personal, gone, elsewhere

    parent, personal, gone, elsewhere = await database_sync_to_async(setup)()
    before = await database_sync_to_async(Message.objects.count)()
    async with member(world.alice) as alice, member(world.bob) as bob:
        await refused(alice, "thread.not_found", text="x", thread=elsewhere.pk)  # another room's message
        await refused(alice, "thread.not_found", text="x", thread=personal.pk)  # bob's personal reply
        await refused(bob, "thread.personal", text="x", thread=personal.pk)  # his own: share it first
        await refused(bob, "thread.deleted", text="x", thread=gone.pk)
        await refused(bob, "thread.not_found", text="x", thread=10**12)
        await refused(bob, "thread.invalid_id", text="x", thread="²")
        await refused(bob, "thread.invalid_id", text="x", thread=True)
        await database_sync_to_async(Membership.objects.filter(room=world.room, user=world.bob).delete)()
        await refused(bob, "room.forbidden", text="x", thread=parent.pk)  # removed, socket still open
        await database_sync_to_async(Room.objects.filter(pk=world.room.pk).update)(status=Room.Status.LOCKED)
        await refused(alice, "room.locked", text="x", thread=parent.pk)
    assert await database_sync_to_async(Message.objects.count)() == before
    assert (await database_sync_to_async(Message.objects.get)(pk=parent.pk)).thread_replies == 0


async def test_a_late_member_resumes_a_reply_streaming_in_a_thread(world: World) -> None:
    await slow(world)
    parent = await database_sync_to_async(put)(world.room, "alice", "a long thread question")
    async with member(world.alice) as alice:
        await post_in(alice, parent.pk, "@a a long answer in the thread please")
        await alice.until(lambda f: any(r.pieces >= 2 for r in f.replies.values()))
        async with member(world.bob) as late:
            live = [(i, r.status, len(r.text)) for i, r in late.frames.replies.items() if r.role == "assistant"]
            await late.until(lambda f: all_final(f, 1))
        await alice.until(lambda f: all_final(f, 1))
    rows = await astored()
    [(reply_id, status, length)] = live
    assert status == "streaming" and length > 0 and rows[reply_id].thread_id == parent.pk
    snapshot = late.raw[0]
    assert f'id="msg-{reply_id}"' not in snapshot_list(snapshot)  # not in the room's list ...
    live_part = snapshot[snapshot.index('<div id="thread-live"') :]
    assert f'id="msg-{reply_id}"' in live_part and f'data-length="{length}"' in live_part  # ... beside it
    assert late.frames.replies[reply_id].pieces >= 1  # the rest came as pieces, gap-free
    assert_integrity(late.frames, rows)
    assert_integrity(alice.frames, rows)


async def test_personal_replies_in_a_thread_stay_their_recipients(world: World) -> None:
    parent = await database_sync_to_async(put)(world.room, "alice", "what should each of us read?")
    await database_sync_to_async(Membership.objects.filter(user=world.bob).update)(lens="I am the designer")
    # Bob first: alice's snapshot already shows him online, so nothing more is due to her.
    async with member(world.bob) as bob, member(world.alice) as alice:
        await post_in(alice, parent.pk, "/each @a a book for me?")
        await bob.until(lambda f: all_final(f, 1))
        rows = await astored()
        [personal] = [r for r in rows.values() if r.recipient_id == world.bob.pk]
        assert personal.thread_id == parent.pk
        await alice.until(
            lambda f: line(alice.raw, parent.pk) is not None and any("each.started" in x for x in alice.raw)
        )
        await alice.assert_silent()
        assert not any(f'id="msg-{personal.pk}' in f for f in alice.raw)
        assert 'data-replies="1"' in (line(alice.raw, parent.pk) or "")  # the question alone is the room's
        await refused(alice, "thread.not_found", text="x", thread=personal.pk)
    client = Client()
    await database_sync_to_async(client.force_login)(world.alice)
    page = await database_sync_to_async(client.get)(f"/r/lab/t/{parent.pk}/")
    assert page.status_code == 200 and f'id="msg-{personal.pk}"' not in page.content.decode()
    await database_sync_to_async(client.force_login)(world.bob)
    page = await database_sync_to_async(client.get)(f"/r/lab/t/{parent.pk}/")
    assert f'id="msg-{personal.pk}"' in page.content.decode()


async def test_votes_work_on_a_reply_in_a_thread(world: World) -> None:
    parent = await database_sync_to_async(put)(world.room, "alice", "rate this")
    async with member(world.alice) as alice, member(world.bob) as bob:
        await post_in(alice, parent.pk, "@a say something")
        await bob.until(lambda f: all_final(f, 1))
        [reply] = [r for r in (await astored()).values() if r.role == "assistant"]
        await bob.send(action="vote", message_id=reply.pk, value="up")
        for m in (alice, bob):
            await m.until(
                lambda f, m=m: any(f'id="msg-{reply.pk}-votes"' in x and 'data-votes-up="1"' in x for x in m.raw)
            )
    assert (await database_sync_to_async(Message.objects.get)(pk=reply.pk)).votes_up == 1


async def test_the_thread_view_search_and_exports(world: World) -> None:
    def setup() -> tuple[Message, Message]:
        parent = put(world.room, "alice", "the release plan")
        reply = put(world.room, "bob", "the zeppelin ships tuesday", thread=parent)
        Message.objects.filter(pk=parent.pk).update(thread_replies=1, thread_last_at=reply.created_at)
        other = Room.objects.create(name="Other", slug="other", owner=world.carol)
        Membership.objects.create(room=other, user=world.carol, role=Membership.Role.OWNER)
        return parent, reply

    parent, reply = await database_sync_to_async(setup)()

    def pages() -> None:
        client = Client()
        client.force_login(world.bob)
        view = client.get(f"/r/lab/t/{parent.pk}/").content.decode()
        assert f'id="thread-{parent.pk}-list"' in view and f'id="msg-{reply.pk}"' in view
        assert 'name="thread"' in view and 'id="thread-composer"' in view
        assert client.get(f"/r/lab/t/{reply.pk}/").status_code == 404  # a thread's message has none of its own
        room = client.get("/r/lab/").content.decode()
        assert f'id="msg-{reply.pk}"' not in room and "1 reply" in room
        found = client.get("/r/lab/search", {"q": "zeppelin"}).content.decode()
        assert f'href="/r/lab/?thread={parent.pk}#msg-{reply.pk}"' in found
        carol = Client()
        carol.force_login(world.carol)
        assert carol.get(f"/r/lab/t/{parent.pk}/").status_code == 404  # not a member
        assert carol.get(f"/r/other/t/{parent.pk}/").status_code == 404  # another room's message
        # A message hidden as a version (its reply asked again) keeps its thread, reachable.
        Message.objects.filter(pk=parent.pk).update(version_hidden=True)
        assert f'id="msg-{reply.pk}"' in client.get(f"/r/lab/t/{parent.pk}/").content.decode()
        Message.objects.filter(pk=parent.pk).update(version_hidden=False)

    await database_sync_to_async(pages)()
    _, body, _ = await database_sync_to_async(exported)(world.bob, "/r/lab/export.json")
    records = {r["id"]: r for r in json.loads(body)["messages"]}
    assert records[reply.pk]["thread"] == parent.seq and records[parent.pk]["thread"] is None
    _, markdown, _ = await database_sync_to_async(exported)(world.bob, "/r/lab/export.md")
    assert f"### #{reply.seq} bob · user, done · ".encode() in markdown
    assert f"· in the thread on #{parent.seq}".encode() in markdown


async def test_a_thread_on_a_reply_still_streaming_shows_with_its_final_article(world: World) -> None:
    await stalling(world, "a")
    async with member(world.alice) as alice:
        await alice.post("@a start talking")
        await alice.until(lambda f: any(r.role == "assistant" and r.pieces >= 1 for r in f.replies.values()))
        [reply] = [i for i, r in alice.frames.replies.items() if r.role == "assistant"]
        await post_in(alice, reply, "a thread on a reply still being written")
        await alice.until(lambda f: len(thread_frames(alice.raw, reply)) == 1)
        await alice.send(action="stop", message_id=reply)
        await alice.until(lambda f: all_final(f, 1))
    final = [f for f in alice.raw if f.startswith(f'<article id="msg-{reply}"') and 'hx-swap-oob="true"' in f][-1]
    assert 'data-replies="1"' in (line([final], reply) or "")  # the count, as stored when it ended


@pytest.mark.parametrize("layer", ["memory"], indirect=True)
async def test_a_thread_leaves_what_this_process_knows_of_the_room(world: World, sim: tuple[str, SimulatorApp]) -> None:
    """Its frames change nothing of the room's history (replies/early.py): the room's next
    post is still sent before it is stored, and right."""
    from collab.chat.replies import early
    from tests.test_early_requests import ask, count

    async with member(world.alice) as alice:
        await ask(alice, "@a a question in the room")
        parent = await database_sync_to_async(Message.objects.filter(role="user").latest)("seq")
        assert early.known(world.room.id) is not None
        await post_in(alice, parent.pk, "@a and one in its thread")
        await alice.until(lambda f: all_final(f, 2))
        await alice.assert_silent()
        assert early.known(world.room.id) is not None
        taken = count("taken")
        await ask(alice, "@a the room's next question")
        assert count("taken") == taken + 1  # guessed from what it knew, and taken: the very request
    turns = [t["content"] for t in request_with(sim, "next question")[1:]]
    assert not any("in its thread" in t for t in turns)


def test_a_long_thread_opens_at_its_newest_messages(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The panel renders the newest THREAD_PAGE messages and says how many came before."""
    from collab.chat.services import threads

    monkeypatch.setattr(threads, "THREAD_PAGE", 2)
    parent = put(world.room, "alice", "the release plan")
    first, second, third = (put(world.room, "bob", f"point {n}", thread=parent) for n in (1, 2, 3))
    client = Client()
    client.force_login(world.bob)
    view = client.get(f"/r/lab/t/{parent.pk}/").content.decode()
    assert f'id="msg-{first.pk}"' not in view
    assert f'id="msg-{second.pk}"' in view and f'id="msg-{third.pk}"' in view
    assert view.index(f'id="msg-{second.pk}"') < view.index(f'id="msg-{third.pk}"')
    assert "1 earlier message of this thread" in view and 'href="/r/lab/search"' in view


def test_a_parent_deleted_as_a_row_leaves_its_thread_in_the_room(world: World) -> None:
    """The admin deletes rows (members leave a tombstone): the thread's messages stay, in the room."""
    parent = put(world.room, "alice", "the release plan")
    reply = put(world.room, "bob", "ship it", thread=parent)
    parent.delete()
    kept = Message.objects.get(pk=reply.pk)
    assert kept.thread_id is None and kept.text == "ship it"
