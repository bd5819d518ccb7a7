"""The data layer under real concurrency: every post from its own thread and connection,
as several server processes would write (run on SQLite and on PostgreSQL)."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from collab.chat.actions import posting
from collab.chat.errors import ClientError
from collab.chat.models import Message
from tests.conftest import World

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 6
POSTS = 8


def _in_thread(fn, *args):  # type: ignore[no-untyped-def]
    try:
        return fn(*args)
    finally:
        connection.close()


def test_concurrent_posts_never_share_or_skip_a_seq(world: World) -> None:
    barrier = threading.Barrier(THREADS)

    def poster(n: int) -> list[int]:
        barrier.wait()
        user = world.alice if n % 2 else world.bob
        return [posting.store_post(user.pk, world.room.pk, f"t{n} m{i}", None)[0].message.seq for i in range(POSTS)]

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(lambda n: _in_thread(poster, n), range(THREADS)))
    seqs = sorted(s for r in results for s in r)
    assert seqs == list(range(1, THREADS * POSTS + 1))
    for r in results:  # each thread saw its own posts in increasing order
        assert r == sorted(r)
    stored = list(Message.objects.order_by("seq").values_list("seq", "created_at"))
    assert [s for s, _ in stored] == seqs
    world.room.refresh_from_db()
    assert world.room.last_seq == THREADS * POSTS


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
