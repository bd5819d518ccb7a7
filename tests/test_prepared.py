"""The post path's reads compiled once (prepared.py) give what their querysets give:
the same rows, the same converted values, the same related instances, in one statement
each. Run on SQLite and on PostgreSQL (CI runs the suite on both)."""

from __future__ import annotations

import gc
import re
import threading
import weakref
from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest
from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.models import Q, QuerySet
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from collab.chat.context import HISTORY_COLUMNS, HISTORY_MESSAGES
from collab.chat.models import Membership, Message, Room
from collab.chat.prepared import Prepared, PreparedUpdate
from collab.chat.replies.jobs import _HISTORY, read_history
from collab.chat.replies.posting import _ASSISTANTS, _MEMBER, _member, _room_assistants
from collab.chat.replies.sink import _CHANGED, _MEANWHILE, _STREAMING
from tests.conftest import World, make_assistant

pytestmark = pytest.mark.django_db


def fields(obj: models.Model) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def test_the_member_read_gives_the_member_user_and_room_as_the_queryset_does(
    world: World, django_assert_num_queries: Any
) -> None:
    Room.objects.filter(pk=world.room.pk).update(reply_to_all=True, budget_cost="2.50")  # a bool, a decimal
    expected = list(_member(world.room.id, world.bob.id))
    with django_assert_num_queries(1):
        [got] = _MEMBER.rows(world.room.id, world.bob.id)
        # the select_related instances came with it: no query more
        user, room = got.user, got.room
    assert fields(got) == fields(expected[0])
    assert fields(user) == fields(expected[0].user) and user.username == "bob"
    assert fields(room) == fields(expected[0].room)
    # converted as the ORM converts: not SQLite's 1, float or text
    assert room.reply_to_all is True and room.budget_cost == Decimal("2.50")
    assert isinstance(room.created_at, datetime) and isinstance(got.joined_at, datetime)
    assert _MEMBER.rows(world.room.id, world.carol.id) == []  # another user's: none


def test_the_assistants_read_gives_the_room_s_assistants_in_handle_order(
    world: World, django_assert_num_queries: Any
) -> None:
    other = Room.objects.create(name="Other", slug="other", owner=world.alice)
    other.assistants.add(make_assistant(world.provider, "zed"))
    world.room.assistants.add(make_assistant(world.provider, "aa", temperature=0.25))
    expected = list(_room_assistants(world.room.id))
    with django_assert_num_queries(1):
        got = _ASSISTANTS.rows(world.room.id)
        providers = [a.provider for a in got]
    assert [a.handle for a in got] == ["a", "aa", "b"]  # its own, not the other room's
    assert [fields(a) for a in got] == [fields(a) for a in expected]
    assert [fields(p) for p in providers] == [fields(a.provider) for a in expected]


def test_the_history_read_gives_the_rows_values_list_gives(world: World) -> None:
    room = world.room
    for seq in range(1, HISTORY_MESSAGES + 6):
        Message.objects.create(
            room=room, seq=seq, role=Message.Role.USER, author=world.alice, author_name="alice", text=f"m{seq}"
        )
    Message.objects.filter(room=room, seq=3).update(merge_of=[1, 2])  # a JSON list
    Message.objects.create(  # a personal reply: no one else's history
        room=room, seq=1000, role=Message.Role.ASSISTANT, recipient=world.bob, author_name="A", text="mine"
    )
    answered = Message.objects.create(
        room=room, seq=1001, role=Message.Role.USER, author=world.bob, author_name="bob", text="?"
    )
    queryset: QuerySet[Message, Any] = (
        Message.objects.filter(Q(seq__lte=answered.seq) | Q(slot_seq__lte=answered.seq), room=room)
        .filter(version_hidden=False)
        .shared()
        .order_by("-seq")
        .values_list(*HISTORY_COLUMNS)[:HISTORY_MESSAGES]
    )
    expected = [tuple(row) for row in queryset]
    got = _HISTORY.values(room.id, answered.seq, answered.seq)
    assert got == expected and len(got) == HISTORY_MESSAGES
    rows = read_history(room, answered)
    assert rows[-1].text == "?" and "mine" not in [r.text for r in rows]
    early = read_history(room, Message.objects.get(room=room, seq=3))
    assert [r.seq for r in early] == [1, 2, 3] and early[-1].merge_of == [1, 2]


def test_a_query_whose_parameters_are_not_its_arguments_is_refused(world: World) -> None:
    twice = Prepared(lambda room_id: Membership.objects.filter(room_id=room_id, user_id=room_id), 1)
    with pytest.raises(ValueError, match="once"):
        twice.rows(world.room.id)
    with pytest.raises(TypeError):
        _MEMBER.rows(world.room.id)


def test_the_read_of_what_changed_while_a_reply_streamed_gives_the_queryset_s_row(world: World) -> None:
    room = world.room
    question = Message.objects.create(
        room=room, seq=1, role=Message.Role.USER, author=world.alice, author_name="alice", text="q"
    )
    reply = Message.objects.create(
        room=room, seq=2, role=Message.Role.ASSISTANT, author_name="A", reply_to=question, text="", votes_up=1
    )
    Message.objects.filter(pk=reply.pk).update(votes_by=[world.bob.id], verdict="approved")
    Message.objects.filter(pk=question.pk).update(edited_at=timezone.now())
    queryset = Message.objects.filter(pk=reply.pk).values_list(*_MEANWHILE, "reply_to__edited_at")[:1]
    [got] = _CHANGED.values(reply.pk)
    assert got == tuple(next(iter(queryset)))
    assert got[_MEANWHILE.index("votes_by")] == [world.bob.id] and isinstance(got[-1], datetime)
    assert _CHANGED.values(reply.pk + 1000) == []


def test_each_thread_compiles_on_its_own_connection_and_lets_it_go_with_the_thread(world: World) -> None:
    """Django's connections are per thread: so is a compiled read, which holds one (a
    thread that ended leaves no connection behind in the cache)."""
    here = _MEMBER.rows(world.room.id, world.bob.id)
    got: list[Any] = []

    def elsewhere() -> None:
        try:
            got.append(_MEMBER.rows(str(world.room.id), world.bob.id))  # type: ignore[arg-type]  # as the ORM: int()
            got.append(weakref.ref(connections[DEFAULT_DB_ALIAS]))
        finally:
            connections.close_all()

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    rows, connection = got
    assert [fields(m) for m in rows] == [fields(m) for m in here]
    del thread
    gc.collect()
    assert connection() is None  # the thread's connection went with it


def _streaming_twins(world: World) -> tuple[Message, Message]:
    made = [
        Message.objects.create(
            room=world.room, seq=seq, role=Message.Role.ASSISTANT, author_name="A", status=Message.Status.STREAMING
        )
        for seq in (1, 2)
    ]
    return made[0], made[1]


def test_the_reply_end_s_write_changes_what_the_queryset_s_update_changes(world: World) -> None:
    """The same statement and the same row as `update()`: a decimal, an aware datetime, a
    float, a None (`col = NULL`), text; once the reply is no longer streaming, nothing."""
    by_orm, prepared = _streaming_twins(world)
    ended_at = timezone.now()
    values: dict[str, Any] = {  # every field sink._store_outcome writes, an agent's run's among them
        "text": "The answer, é.",
        "html": "<p>The answer, é.</p>",
        "status": Message.Status.DONE,
        "error": "",
        "finished_at": ended_at,
        "ttft_ms": None,
        "tokens": 3,
        "prompt_tokens": 40,
        "duration_ms": 12.5,
        "tps": 751.5,
        "cost": Decimal("0.000123"),
        "reasoning": "Thought.",
        "finish_reason": "",
        "agent_steps": 2,  # a small-integer column
    }
    with CaptureQueriesContext(connections[DEFAULT_DB_ALIAS]) as orm_sql:
        assert Message.objects.filter(pk=by_orm.pk, status=Message.Status.STREAMING).update(**values) == 1
    with CaptureQueriesContext(connections[DEFAULT_DB_ALIAS]) as our_sql:
        assert _STREAMING.run(values, prepared.pk) == 1
    which = re.compile(r'("id" = )[0-9]+')  # the statements as run, but for the row's id
    assert [which.sub(r"\1N", q["sql"]) for q in our_sql.captured_queries] == [
        which.sub(r"\1N", q["sql"]) for q in orm_sql.captured_queries
    ]
    assert '"id" = N' in which.sub(r"\1N", our_sql.captured_queries[0]["sql"])
    by_orm.refresh_from_db()
    prepared.refresh_from_db()
    apart = {"id": 0, "seq": 0, "created_at": 0}  # the twins differ in these alone
    assert {**fields(prepared), **apart} == {**fields(by_orm), **apart}
    assert prepared.cost == Decimal("0.000123") and prepared.finished_at == ended_at and prepared.ttft_ms is None
    assert (prepared.agent_steps, prepared.reasoning) == (2, "Thought.")
    assert _STREAMING.run(values, prepared.pk) == 0  # ended: not streaming any more
    assert _STREAMING.run(values, prepared.pk + 1000) == 0  # no such reply


def test_the_reply_end_s_write_is_compiled_per_shape_of_its_values(world: World) -> None:
    """A value that is None in one call and not in the next (Django writes `= NULL` for a
    None): each call writes its own values."""
    reply, _ = _streaming_twins(world)
    assert _STREAMING.run({"text": "a", "ttft_ms": 12.5}, reply.pk) == 1
    assert _STREAMING.run({"text": "b", "ttft_ms": None}, reply.pk) == 1
    reply.refresh_from_db()
    assert (reply.text, reply.ttft_ms) == ("b", None)
    assert _STREAMING.run({"ttft_ms": 3.0, "text": "c"}, str(reply.pk)) == 1  # type: ignore[arg-type]  # as the ORM: int()
    reply.refresh_from_db()
    assert (reply.text, reply.ttft_ms) == ("c", 3.0)


def test_a_write_whose_parameters_are_not_its_arguments_is_refused(world: World) -> None:
    twice = PreparedUpdate(lambda room_id: Message.objects.filter(room_id=room_id, seq=room_id), 1)
    with pytest.raises(ValueError, match="once"):
        twice.run({"text": "x"}, world.room.id)
    with pytest.raises(TypeError):
        _STREAMING.run({"text": "x"})
    with pytest.raises(ValueError, match="nothing"):
        _STREAMING.run({}, world.room.id)
    with pytest.raises(ValueError, match="sliced"):  # update() refuses it; compiled, the slice would go
        PreparedUpdate(lambda room_id: Message.objects.filter(room_id=room_id)[:1], 1)
    nowhere = PreparedUpdate(lambda room_id: Message.objects.filter(room_id=room_id).none(), 1)
    with pytest.raises(ValueError, match="no row"):
        nowhere.run({"text": "x"}, world.room.id)
