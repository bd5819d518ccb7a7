"""Editing and deleting one's own message, over real WebSocket clients (docs/wire.md,
"edit" and "delete"): both broadcast to every member, a delete leaves a tombstone (also
in the snapshot of a member who connects later), replies already made stay and are
marked as answering an edited message, and the next reply's request to the (real,
simulated) model holds the edited text and not the deleted one. Every forged frame (a
message of someone else's, an assistant's reply, another room's message, a bad id or
text, a locked room) is refused with its code and changes nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth.models import User

from collab.chat.models import Membership, Message, Room
from collab.loadtest.wire import articles
from tests.conftest import Member, World, all_final, member, stalling

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("replies_idle")]
live = pytest.mark.usefixtures("layer")
memory = pytest.mark.usefixtures("memory_layer")


@pytest.fixture(autouse=True)
def _roomy_rate(settings: Any) -> None:
    """Edits and deletes share the posting rate: enough of it for a test's many frames."""
    settings.COLLAB = {**settings.COLLAB, "POST_BURST": 100}


@pytest.fixture
def requests_seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[dict[str, Any]]]]:
    """The messages of every request the simulated model (a real server, in this process)
    is sent, in order; it answers as usual."""
    from collab.simulator import reply

    seen: list[list[dict[str, Any]]] = []
    original = reply.iter_tokens

    def recording(messages: Any, *args: Any, **kw: Any) -> Iterator[str]:
        seen.append(list(messages))
        return original(messages, *args, **kw)

    monkeypatch.setattr(reply, "iter_tokens", recording)
    yield seen


def _message(pk: int) -> Message:
    return Message.objects.get(pk=pk)


amessage = database_sync_to_async(_message)


def _store(room: Room, author: User | None, text: str, role: str = "user", **kw: Any) -> Message:
    seq = Room.objects.get(pk=room.pk).last_seq + 1
    Room.objects.filter(pk=room.pk).update(last_seq=seq)
    name = author.get_username() if author else "A"
    return Message.objects.create(room=room, seq=seq, role=role, author=author, author_name=name, text=text, **kw)


astore = database_sync_to_async(_store)


async def _posted(m: Member, text: str) -> int:
    """Post `text` and wait for its article: its id."""
    cid = await m.post(text)
    await m.until(lambda f: any(cid in raw for raw in m.raw))
    [raw] = [r for r in m.raw if cid in r]
    (found,) = [a.msg for a in articles(raw) if a.attrs.get("data-client-id") == cid]
    return found


def _final(m: Member, msg_id: int) -> dict[str, str]:
    return m.frames.replies[msg_id].final_attrs if msg_id in m.frames.replies else {}


@live
async def test_an_edit_is_broadcast_stored_and_marked(world: World) -> None:
    async with member(world.alice) as alice, member(world.bob) as bob:
        msg_id = await _posted(alice, "the first `draft`")
        await bob.until(lambda f: msg_id in f.replies)
        await alice.send(action="edit", message_id=msg_id, text="the `second` draft <b>")
        for m in (alice, bob):
            await m.until(lambda f, m=m: _final(m, msg_id).get("data-edited") == "1")
            html = m.frames.replies[msg_id].final_html
            assert "<code>second</code>" in html and "&lt;b&gt;" in html and "draft" in html
        assert ">edited<" in bob.raw[-1]
    stored = await amessage(msg_id)
    assert stored.text == "the `second` draft <b>" and stored.edited_at is not None
    assert "<code>second</code>" in stored.html and stored.deleted_at is None


@live
async def test_a_delete_is_broadcast_as_a_tombstone_also_in_a_later_snapshot(world: World) -> None:
    async with member(world.alice) as alice, member(world.bob) as bob:
        msg_id = await _posted(alice, "something to take back")
        await alice.send(action="delete", message_id=msg_id)
        for m in (alice, bob):
            await m.until(lambda f, m=m: _final(m, msg_id).get("data-deleted") == "1")
            assert "something to take back" not in m.frames.replies[msg_id].final_html
            assert "This message was deleted." in m.frames.replies[msg_id].final_html
    stored = await amessage(msg_id)
    assert (stored.text, stored.html) == ("", "") and stored.deleted_at is not None
    async with member(world.bob) as later:  # the snapshot holds the tombstone, not the text
        snapshot = later.raw[0]
        assert f'id="msg-{msg_id}"' in snapshot and 'data-deleted="1"' in snapshot
        assert "something to take back" not in snapshot and "This message was deleted." in snapshot


@memory
async def test_forged_edits_and_deletes_are_refused_and_change_nothing(world: World) -> None:
    other_room = await database_sync_to_async(Room.objects.create)(name="Other", slug="other", owner=world.bob)
    await database_sync_to_async(Membership.objects.create)(room=other_room, user=world.bob)
    elsewhere = await astore(other_room, world.bob, "bob's, in another room")
    reply = await astore(world.room, None, "an assistant's answer", role="assistant", assistant=world.assistants["a"])
    async with member(world.alice) as alice, member(world.bob) as bob:
        mine = await _posted(alice, "alice's own words")
        own = await _posted(bob, "bob's own words")
        before = {
            pk: (m.text, m.edited_at, m.deleted_at)
            for pk in (mine, reply.pk, elsewhere.pk, own)
            for m in [await amessage(pk)]
        }
        await alice.until(lambda f: own in f.replies)
        cases: list[tuple[dict[str, Any], str]] = [
            ({"action": "edit", "message_id": mine, "text": "bob was here"}, "message.not_yours"),
            ({"action": "delete", "message_id": mine}, "message.not_yours"),
            ({"action": "edit", "message_id": reply.pk, "text": "a better answer"}, "message.not_yours"),
            ({"action": "delete", "message_id": reply.pk}, "message.not_yours"),
            ({"action": "edit", "message_id": elsewhere.pk, "text": "moved"}, "message.not_found"),
            ({"action": "delete", "message_id": elsewhere.pk}, "message.not_found"),
            ({"action": "delete", "message_id": "12abc"}, "message.invalid_id"),
            ({"action": "edit", "message_id": True, "text": "x"}, "message.invalid_id"),
            ({"action": "delete"}, "message.invalid_id"),
            ({"action": "edit", "message_id": own, "text": "   "}, "message.empty"),
            ({"action": "edit", "message_id": own}, "message.invalid"),
            (
                {"action": "edit", "message_id": own, "text": "x" * (settings.COLLAB["MAX_MESSAGE_CHARS"] + 1)},
                "message.too_long",
            ),
            ({"action": "edit", "message_id": own, "text": "nul \x00"}, "message.invalid_text"),
        ]
        for frame, _code in cases:
            await bob.send(**frame)
        await bob.until(lambda f: len(f.errors) >= len(cases))
        assert [c for c, _ in bob.frames.errors] == [code for _, code in cases]
        await alice.assert_silent()  # nothing was broadcast
        after = {pk: (m.text, m.edited_at, m.deleted_at) for pk in before for m in [await amessage(pk)]}
        assert after == before


@memory
async def test_edit_and_delete_are_refused_in_a_locked_room_and_after_a_delete(world: World) -> None:
    async with member(world.alice) as alice:
        msg_id = await _posted(alice, "before the lock")
        gone = await _posted(alice, "soon gone")
        await alice.send(action="delete", message_id=gone)
        await alice.until(lambda f: _final(alice, gone).get("data-deleted") == "1")
        await alice.send(action="edit", message_id=gone, text="back again")
        await alice.until(lambda f: len(f.errors) >= 1)
        await database_sync_to_async(Room.objects.filter(pk=world.room.pk).update)(status=Room.Status.LOCKED)
        await alice.send(action="edit", message_id=msg_id, text="after the lock")
        await alice.send(action="delete", message_id=msg_id)
        await alice.until(lambda f: len(f.errors) >= 3)
        assert [c for c, _ in alice.frames.errors] == ["message.deleted", "room.locked", "room.locked"]
    stored = await amessage(msg_id)
    assert stored.text == "before the lock" and stored.edited_at is None and stored.deleted_at is None
    assert (await amessage(gone)).text == ""


@memory
async def test_the_next_request_holds_the_edit_and_skips_the_deleted(
    world: World, requests_seen: list[list[dict[str, Any]]]
) -> None:
    async with member(world.alice) as alice, member(world.bob) as bob:
        asked = await _posted(alice, "@a what is the ORIGINAL-WORD")
        await alice.until(lambda f: all_final(f, 1))
        [first_reply] = [i for i, r in alice.frames.replies.items() if r.role == "assistant"]
        aside = await _posted(bob, "an aside SECRET-ASIDE")
        await alice.send(action="edit", message_id=asked, text="@a what is the EDITED-WORD")
        # the reply already made stays, marked as answering an edited message
        await bob.until(lambda f: _final(bob, first_reply).get("data-answers-edited") == "1")
        assert "answers an edited message" in bob.frames.replies[first_reply].final_html or any(
            "answers an edited message" in raw for raw in bob.raw
        )
        await bob.send(action="delete", message_id=aside)
        await alice.until(lambda f: _final(alice, aside).get("data-deleted") == "1")
        await _posted(alice, "@a and now?")
        await alice.until(lambda f: all_final(f, 2))
    history = "\n".join(str(m["content"]) for m in requests_seen[-1])
    assert "EDITED-WORD" in history and "ORIGINAL-WORD" not in history
    assert "SECRET-ASIDE" not in history
    assert (await amessage(first_reply)).text  # the old reply is still there, unchanged


@memory
async def test_an_unchanged_edit_sends_nothing(world: World) -> None:
    async with member(world.alice) as alice, member(world.bob) as bob:
        msg_id = await _posted(alice, "as it is")
        await bob.until(lambda f: msg_id in f.replies)
        seen = len(bob.raw)
        await alice.send(action="edit", message_id=msg_id, text="  as it is  ")
        # Alice's actions run in order: once her next post reaches bob, the edit was handled.
        marker = await _posted(alice, "after the edit")
        await bob.until(lambda f: marker in f.replies)
        assert not any(f'id="msg-{msg_id}"' in r for r in bob.raw[seen:])
    assert (await amessage(msg_id)).edited_at is None


def test_the_edit_form_is_for_the_author_only(world: World) -> None:
    from django.test import Client

    message = _store(world.room, world.alice, "my words <i>")
    reply = _store(world.room, None, "an answer", role="assistant", assistant=world.assistants["a"])
    url = f"/r/lab/m/{message.pk}/edit/"
    alice, bob, carol = Client(), Client(), Client()
    alice.force_login(world.alice)
    bob.force_login(world.bob)
    carol.force_login(world.carol)
    page = alice.get(url)
    assert page.status_code == 200
    body = page.content.decode()
    assert "my words &lt;i&gt;" in body and '"action": "edit"' in body and f'"message_id": {message.pk}' in body
    assert bob.get(url).status_code == 404  # not his
    assert carol.get(url).status_code == 404  # not a member
    assert alice.get(f"/r/lab/m/{reply.pk}/edit/").status_code == 404  # not a person's message
    assert alice.get(f"/r/lab/m/{uuid.uuid4().int % 10**9}/edit/").status_code == 404


@memory
async def test_a_reply_streaming_while_its_question_is_edited_ends_marked(world: World) -> None:
    await stalling(world, "a")
    async with member(world.alice) as alice:
        asked = await _posted(alice, "@a a question to change")
        await alice.until(lambda f: any(r.role == "assistant" and r.pieces >= 1 for r in f.replies.values()))
        [reply] = [i for i, r in alice.frames.replies.items() if r.role == "assistant"]
        await alice.send(action="edit", message_id=asked, text="@a the changed question")
        await alice.until(lambda f: _final(alice, asked).get("data-edited") == "1")
        assert reply not in [i for i, r in alice.frames.replies.items() if r.final_attrs]  # still streaming
        await alice.send(action="stop", message_id=reply)
        await alice.until(lambda f: all_final(f, 1))
        assert _final(alice, reply).get("data-answers-edited") == "1"
        assert _final(alice, reply).get("data-status") == "stopped"


@memory
async def test_an_edit_frame_stays_within_the_snapshot_budget(world: World) -> None:
    """The replies re-sent with an edit are whole while they fit SNAPSHOT_BYTES, then only
    their "show all" button: never near the 1 MiB a WebSocket frame may be."""
    async with member(world.alice) as alice, member(world.bob) as bob:
        asked = await _posted(alice, "a question with long answers")
        big = "<p>" + "x" * 120_000 + "</p>"
        replies = [
            await astore(world.room, None, "x" * 120_000, role="assistant", assistant=world.assistants["a"],
                         reply_to_id=asked, html=big)
            for _ in range(8)
        ]  # fmt: skip
        await bob.until(lambda f: asked in f.replies)
        await alice.send(action="edit", message_id=asked, text="the question, changed")
        await bob.until(lambda f: all(_final(bob, r.pk).get("data-answers-edited") == "1" for r in replies))
    frame = bob.raw[-1]
    assert len(frame.encode()) <= 256 * 1024
    assert frame.count('data-truncated="1"') >= 6  # most of them as their button alone
