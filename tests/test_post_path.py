"""The post path's database work (issue 9, lever 4): the fewest round trips per post, and
no history read inside the write transaction. On SQLite and on PostgreSQL."""

from __future__ import annotations

import uuid

import pytest
from channels.db import database_sync_to_async
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext

from collab.chat.actions import posting, replies
from collab.chat.models import Message
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
        "SELECT chat_message",  # a repeat of this client_id?
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
        "SELECT chat_message",
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

    monkeypatch.setattr(replies, "reply_jobs", broken)
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.post("@a hello")
        await bob.until(lambda f: any(r.role == "user" for r in f.replies.values()))
        stored = await database_sync_to_async(list)(Message.objects.order_by("seq").values("role", "status", "error"))
        assert [m["role"] for m in stored] == ["user", "assistant"]
        assert stored[1]["status"] == "failed" and "ask again" in stored[1]["error"]
        await alice.until(lambda f: any(r.role == "assistant" for r in f.replies.values()))
        assert not alice.frames.errors  # stored: the sender is never told to try again
        assert 'data-status="failed"' in "".join(alice.raw)
