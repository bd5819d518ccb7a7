"""The data layer under real concurrency: every post from its own thread and connection,
as several server processes would write (run on SQLite and on PostgreSQL)."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from collab.chat.errors import ClientError
from collab.chat.models import Message
from collab.chat.replies import posting
from collab.chat.services import rooms
from tests.conftest import World

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 6
POSTS = 8


def _in_thread(fn, *args):  # type: ignore[no-untyped-def]
    try:
        return fn(*args)
    finally:
        connection.close()


def test_concurrent_posters_never_share_or_skip_a_seq(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """THREADS posters, each on its own thread and database connection, post POSTS messages
    each; every other one mentions @a, so its post reserves two seqs (the reply's too).

    Every round, all posters are provably at once where a race would hurt: on PostgreSQL
    inside their transactions, about to allocate (a barrier of all of them in front of
    rooms.allocate_seqs); on SQLite, whose BEGIN IMMEDIATE lets one writer in at a time,
    at the door of their transactions. The seqs of all posters together must then be
    1..N with none shared and none skipped, each post's reply right after its post."""
    concurrent_writers = connection.vendor != "sqlite"
    barrier = threading.Barrier(THREADS, timeout=30)
    allocate = rooms.allocate_seqs

    def allocate_together(room_id: int, count: int, open_only: bool = False) -> int:
        barrier.wait()  # every poster is inside its own transaction here
        return allocate(room_id, count, open_only=open_only)

    if concurrent_writers:
        monkeypatch.setattr(rooms, "allocate_seqs", allocate_together)

    def poster(n: int) -> list[tuple[int, str, list[int]]]:
        user = world.alice if n % 2 else world.bob
        posted = []
        try:
            for i in range(POSTS):
                if not concurrent_writers:
                    barrier.wait()
                text = f"@a t{n} m{i}" if (n + i) % 2 else f"t{n} m{i}"
                result, placeholders, _jobs = posting.store_post(user.pk, world.room.pk, text, None)
                posted.append((result.message.seq, text, [r.seq for r in placeholders]))
        except BaseException:
            barrier.abort()  # the others stop waiting for this one: the first error is the failure
            raise
        return posted

    with ThreadPoolExecutor(THREADS) as pool:
        futures = [pool.submit(_in_thread, poster, n) for n in range(THREADS)]
    failures = [e for f in futures if (e := f.exception()) and not isinstance(e, threading.BrokenBarrierError)]
    if failures:
        raise failures[0]
    results = [f.result() for f in futures]

    every = sorted(s for posts in results for seq, _text, replies in posts for s in (seq, *replies))
    total = THREADS * POSTS + THREADS * POSTS // 2  # a post each, and a reply for every other one
    assert every == list(range(1, total + 1))  # across all posters: none shared, none skipped
    for posts in results:
        for seq, text, replies in posts:
            assert replies == ([seq + 1] if text.startswith("@a") else [])
    stored = dict(Message.objects.values_list("seq", "text"))
    assert {seq: text for posts in results for seq, text, _ in posts}.items() <= stored.items()
    assert sorted(stored) == every
    world.room.refresh_from_db()
    assert world.room.last_seq == total


def test_same_client_id_from_concurrent_connections_posts_once(world: World) -> None:
    client_id = uuid.uuid4()
    barrier = threading.Barrier(THREADS)

    def poster(_n: int) -> tuple[int, bool]:
        barrier.wait()
        result = posting.store_post(world.alice.pk, world.room.pk, "only once", client_id)[0]
        return result.message.pk, result.created

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(lambda n: _in_thread(poster, n), range(THREADS)))
    assert len({pk for pk, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert Message.objects.count() == 1


def test_post_with_mentions_reserves_seqs_for_replies(world: World) -> None:
    result, replies, jobs = posting.store_post(world.alice.pk, world.room.pk, "@a @B @a hi", None)
    assert result.message.seq == 1
    assert [(r.seq, r.author_name, r.status) for r in replies] == [
        (2, "A", "streaming"),
        (3, "B", "streaming"),
    ]
    assert [j.message_id for j in jobs] == [r.pk for r in replies]
    system, *turns = jobs[0].messages
    assert system["role"] == "system" and "@a" in system["content"] and "testing" in system["content"]
    assert turns == [{"role": "user", "content": "alice: @a @B @a hi"}]


def test_non_member_cannot_post(world: World) -> None:
    with pytest.raises(ClientError) as err:
        posting.store_post(world.carol.pk, world.room.pk, "hi", None)
    assert err.value.code == "room.forbidden"
    assert not Message.objects.exists()


def test_context_budget_keeps_newest_and_labels_speakers(world: World) -> None:
    from collab.chat.context import build_context

    for i in range(30):
        posting.store_post(world.bob.pk, world.room.pk, f"message number {i} " + "x" * 50, None)
    history = list(Message.objects.order_by("seq"))
    context = build_context(world.assistants["a"], world.room, history, budget_chars=400)
    turns = context[1:]
    assert 1 <= len(turns) < 30
    assert turns[-1]["content"].startswith("bob: message number 29")
    assert sum(len(t["content"]) for t in turns) <= 400


def test_provider_context_budget_overrides_the_default(world: World) -> None:
    for i in range(30):
        posting.store_post(world.bob.pk, world.room.pk, f"message number {i} " + "x" * 50, None)
    world.provider.context_chars = 300
    world.provider.save()
    _, _, jobs = posting.store_post(world.alice.pk, world.room.pk, "@a sum it up", None)
    turns = jobs[0].messages[1:]
    assert sum(len(t["content"]) for t in turns) <= 300
    assert turns[-1]["content"] == "alice: @a sum it up"
