"""The post path's database work (issue 9, lever 4): the fewest round trips per post, and
no history read inside the write transaction. On SQLite and on PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from collab.chat import rendering
from collab.chat.errors import ClientError
from collab.chat.generation import Outcome
from collab.chat.models import Message, Room
from collab.chat.replies import posting, sink
from tests.conftest import World, member


def statements(queries: CaptureQueriesContext) -> list[str]:
    """Each statement's kind and table (the transaction's own BEGIN/COMMIT left out)."""
    out = []
    for q in queries.captured_queries:
        sql = q["sql"]
        kind = sql.split(" ", 1)[0].upper()
        if kind in ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE"):
            continue
        table = next((t for t in ("chat_membership", "chat_message", "chat_assistant", "chat_room") if t in sql), "?")
        out.append(f"{kind} {table}{' history' if 'LIMIT 60' in sql else ''}")
    return out


def test_a_plain_post_reads_no_assistants_and_no_history(world: World) -> None:
    with CaptureQueriesContext(connection) as queries:
        result, placeholders, jobs = posting.store_post(world.alice.id, world.room.id, "just a note", uuid.uuid4())
    assert result.created and placeholders == [] and jobs == []
    assert statements(queries) == [
        "SELECT chat_membership",  # the member, with the user and the room
        # (no read for a repeat of this client_id: the unique constraint finds one)
        "UPDATE chat_room",  # the seq, returned by the update
        "INSERT chat_message",
    ]


def test_a_post_that_asks_reads_its_context_after_the_commit(world: World) -> None:
    posting.store_post(world.bob.id, world.room.id, "earlier words", uuid.uuid4())
    with CaptureQueriesContext(connection) as queries:
        result, placeholders, jobs = posting.store_post(world.alice.id, world.room.id, "@a hello", uuid.uuid4())
    assert result.created and len(placeholders) == 1 and len(jobs) == 1
    assert statements(queries) == [
        "SELECT chat_membership",
        "SELECT chat_assistant",  # the room's assistants: @a is one
        "UPDATE chat_room",
        "INSERT chat_message",  # the post
        "INSERT chat_message",  # the reply's placeholder
        "SELECT chat_message history",  # its context, read once the writes are committed
    ]
    kinds = [q["sql"].split(" ", 1)[0].upper() for q in queries.captured_queries]
    if connection.vendor == "sqlite":  # (PostgreSQL's BEGIN and COMMIT are not captured statements)
        assert kinds.index("COMMIT") == len(kinds) - 2 and kinds[-1] == "SELECT"  # the history after COMMIT
    history = "\n".join(str(m["content"]) for m in jobs[0].messages)
    assert "earlier words" in history and "@a hello" in history


@pytest.mark.usefixtures("memory_layer", "replies_idle")
async def test_a_stored_post_whose_context_fails_is_announced_with_its_reply_failed(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise DatabaseError("the connection broke after the commit")

    monkeypatch.setattr(posting, "reply_jobs", broken)  # as posting.py calls it
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.post("@a hello")
        await bob.until(lambda f: any(r.role == "user" for r in f.replies.values()))
        stored = await database_sync_to_async(list)(Message.objects.order_by("seq").values("role", "status", "error"))
        assert [m["role"] for m in stored] == ["user", "assistant"]
        assert stored[1]["status"] == "failed" and "ask again" in stored[1]["error"]
        await alice.until(lambda f: any(r.role == "assistant" for r in f.replies.values()))
        assert not alice.frames.errors  # stored: the sender is never told to try again
        assert 'data-status="failed"' in "".join(alice.raw)


def test_a_repeat_is_acknowledged_as_stored_even_once_the_room_is_locked(world: World) -> None:
    """No read for a repeat before the insert: the unique constraint finds it, and a repeat
    that the room's lock (or a budget) would refuse is still acknowledged as stored."""
    cid = uuid.uuid4()
    first, _, _ = posting.store_post(world.alice.id, world.room.id, "once", cid)
    again, placeholders, jobs = posting.store_post(world.alice.id, world.room.id, "once", cid)
    assert first.created and not again.created and again.message.pk == first.message.pk
    assert placeholders == [] and jobs == []
    Room.objects.filter(pk=world.room.pk).update(status=Room.Status.LOCKED)
    locked, _, _ = posting.store_post(world.alice.id, world.room.id, "once", cid)
    assert not locked.created and locked.message.pk == first.message.pk
    with pytest.raises(ClientError) as refused:  # a new post in the locked room is refused
        posting.store_post(world.alice.id, world.room.id, "twice", uuid.uuid4())
    assert refused.value.code == "room.locked"
    with pytest.raises(ClientError) as forbidden:  # not a member: refused, whatever the client_id
        posting.store_post(world.carol.id, world.room.id, "once", cid)
    assert forbidden.value.code == "room.forbidden"
    assert list(Message.objects.values_list("text", flat=True)) == ["once"]


def final_as_read_whole(reply_id: int) -> str:
    return rendering.frame_final(Message.objects.select_related("recipient", "reply_to").get(pk=reply_id))


def test_a_final_from_its_placeholder_is_the_article_read_whole(world: World) -> None:
    """A reply's end reads only what may have changed while it streamed (the votes, the
    question's edit), not the row with its relations: the same final article, in two statements."""
    result, (placeholder,), (job,) = posting.store_post(world.alice.id, world.room.id, "@a hello", uuid.uuid4())
    edited = timezone.now() + timedelta(seconds=1)  # after the reply was created
    Message.objects.filter(pk=placeholder.pk).update(
        votes_up=2, verdict="approved", votes_by=[{"voter": "bob", "value": "up"}]
    )
    Message.objects.filter(pk=result.message.pk).update(edited_at=edited, text="hello, edited")
    with CaptureQueriesContext(connection) as queries:
        message = sink._store_outcome(job, Outcome("The answer.", "done", tokens=3), "<p>The answer.</p>", placeholder)
    assert statements(queries) == ["UPDATE chat_message", "SELECT chat_message"]
    assert message is not None and placeholder.votes_up == 0  # the post's own instance is left as it was
    html = rendering.frame_final(message)
    assert html == final_as_read_whole(placeholder.pk)
    assert 'data-votes-up="2"' in html and 'data-answers-edited="1"' in html and "The answer." in html


def test_a_reply_shared_orphaned_or_deleted_while_it_streamed_is_read_whole(world: World) -> None:
    _, (shared,), (job,) = posting.store_post(world.alice.id, world.room.id, "@a one", uuid.uuid4())
    Message.objects.filter(pk=shared.pk).update(recipient=world.bob)  # not its placeholder's recipient
    message = sink._store_outcome(job, Outcome("Yes.", "done"), "<p>Yes.</p>", shared)
    assert message is not None and message.recipient_id == world.bob.id
    assert rendering.frame_final(message) == final_as_read_whole(shared.pk)
    question, (orphan,), (job,) = posting.store_post(world.alice.id, world.room.id, "@a why", uuid.uuid4())
    Message.objects.filter(pk=question.message.pk).delete()  # staff, in the admin: its reply_to is set null
    message = sink._store_outcome(job, Outcome("Because.", "done"), "<p>Because.</p>", orphan)
    assert message is not None and message.reply_to_id is None
    assert rendering.frame_final(message) == final_as_read_whole(orphan.pk)
    _, (gone,), (job,) = posting.store_post(world.alice.id, world.room.id, "@a two", uuid.uuid4())
    Message.objects.filter(pk=gone.pk).update(deleted_at=timezone.now())
    message = sink._store_outcome(job, Outcome("No.", "done"), "<p>No.</p>", gone)
    assert message is not None and message.deleted_at is not None
    assert rendering.frame_final(message) == final_as_read_whole(gone.pk)
