"""A room's monthly budget (docs/wire.md, "budgets"): once spent, an invocation (a post
that would start replies, a regeneration) gets `room.budget` with the date it resets, and
the simulated model (a real server) is sent no request; the header shows what is left,
live; owners see it on the settings page; staff raise it in the admin, audited."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from collab.chat.models import AuditEntry, Membership, Message, Room
from collab.chat.services import budgets
from collab.loadtest.wire import attributes
from tests.conftest import Member, World, all_final, member, reply_ids

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("replies_idle")]
live = pytest.mark.usefixtures("layer")  # in memory, and on Redis (both channel layers)
memory = pytest.mark.usefixtures("memory_layer")

BUDGET_RE = re.compile(r'<span id="budget"[^>]*hx-swap-oob="true"([^>]*)>')


def set_budget(world: World, tokens: int | None = None, cost: Decimal | None = None) -> None:
    Room.objects.filter(pk=world.room.pk).update(budget_tokens=tokens, budget_cost=cost)


def used_tokens(world: World) -> int:
    return sum((m.prompt_tokens or 0) + (m.tokens or 0) for m in Message.objects.filter(room=world.room))


def budget_frames(m: Member) -> list[dict[str, str]]:
    found = []
    for frame in m.raw:
        for attrs in BUDGET_RE.findall(frame):
            found.append(attributes(attrs))
    return found


def completions(sim: tuple[str, Any]) -> int:
    return int(sim[1].stats.completions)


def test_the_month_is_the_calendar_month_in_utc() -> None:
    mid = datetime(2026, 12, 15, 10, tzinfo=UTC)
    assert budgets.month_start(mid) == datetime(2026, 12, 1, tzinfo=UTC)
    assert budgets.resets_on(mid) == date(2027, 1, 1)
    assert budgets.resets_on(datetime(2027, 2, 28, 23, 59, tzinfo=UTC)) == date(2027, 3, 1)


@memory
def test_the_check_is_one_aggregate_query_and_none_without_a_budget(world: World) -> None:
    room = Room.objects.get(pk=world.room.pk)
    with CaptureQueriesContext(connection) as none:
        budgets.check(room)
    assert len(none) == 0
    set_budget(world, tokens=1000, cost=Decimal("1.00"))
    room = Room.objects.get(pk=world.room.pk)
    with CaptureQueriesContext(connection) as one:
        budgets.check(room)
    assert len(one) == 1 and "SUM" in one[0]["sql"].upper()


@live
async def test_a_spent_budget_makes_no_upstream_call_and_says_when_it_resets(
    world: World, sim: tuple[str, Any]
) -> None:
    await database_sync_to_async(set_budget)(world, tokens=50)  # one reply spends it
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.post("@a spend it")
        await alice.until(lambda f: all_final(f, 1))
        used = await database_sync_to_async(used_tokens)(world)
        assert used >= 50
        calls = completions(sim)
        # A post that would start a reply: stored (people can still talk), no reply, told why.
        await bob.post("@a and now?")
        await bob.until(lambda f: bool(f.errors))
        code, text = bob.frames.errors[0]
        assert code == "room.budget"
        assert budgets.resets_on().isoformat() in text
        # A regeneration: refused, nothing stored.
        (reply_id,) = reply_ids(alice.frames)
        await bob.send(action="regenerate", message_id=reply_id)
        await bob.until(lambda f: len(f.errors) == 2)
        assert bob.frames.errors[1][0] == "room.budget"
        # A plain message is no invocation: it goes through without an error.
        await bob.post("just talking")
        await alice.until(lambda f: any("just talking" in frame for frame in alice.raw))
        assert len(bob.frames.errors) == 2
    assert completions(sim) == calls  # the provider was never called

    def stored() -> tuple[list[str], int]:
        texts = list(Message.objects.filter(role=Message.Role.USER).values_list("text", flat=True))
        return texts, Message.objects.filter(role=Message.Role.ASSISTANT).count()

    assert await database_sync_to_async(stored)() == (["@a spend it", "@a and now?", "just talking"], 1)


@memory
async def test_a_spent_budget_refuses_a_continuation_and_changes_nothing(world: World, sim: tuple[str, Any]) -> None:
    await database_sync_to_async(set_budget)(world, tokens=10)

    def cut_off() -> int:
        question = Message.objects.create(room=world.room, seq=1, role="user", author=world.alice, text="long one")
        reply = Message.objects.create(
            room=world.room, seq=2, role="assistant", author_name="A", reply_to=question,
            assistant=world.assistants["a"], text="half an ans", tokens=20, finish_reason="length",
        )  # fmt: skip
        Room.objects.filter(pk=world.room.pk).update(last_seq=2)
        return reply.pk

    reply_id = await database_sync_to_async(cut_off)()
    calls = completions(sim)
    async with member(world.alice) as alice:
        await alice.send(action="continue", message_id=reply_id)
        await alice.until(lambda f: bool(f.errors))
        assert alice.frames.errors[0][0] == "room.budget"
    reply = await database_sync_to_async(Message.objects.get)(pk=reply_id)
    assert (reply.status, reply.finish_reason, reply.text) == ("done", "length", "half an ans")
    assert completions(sim) == calls


@memory
async def test_a_spent_cost_budget_refuses_too(world: World, sim: tuple[str, Any]) -> None:
    await database_sync_to_async(set_budget)(world, cost=Decimal("0.01"))

    def spent() -> None:
        question = Message.objects.create(room=world.room, seq=1, role="user", author=world.alice, text="earlier")
        Message.objects.create(
            room=world.room, seq=2, role="assistant", author_name="A", reply_to=question, cost=Decimal("0.02")
        )
        Room.objects.filter(pk=world.room.pk).update(last_seq=2)

    await database_sync_to_async(spent)()
    calls = completions(sim)
    async with member(world.alice) as alice:
        await alice.post("@all hello")
        await alice.until(lambda f: bool(f.errors))
        assert alice.frames.errors[0][0] == "room.budget"
    assert completions(sim) == calls


@memory
async def test_last_months_use_does_not_count(world: World, sim: tuple[str, Any]) -> None:
    await database_sync_to_async(set_budget)(world, tokens=100)

    def old_use() -> None:
        question = Message.objects.create(room=world.room, seq=1, role="user", author=world.alice, text="earlier")
        old = Message.objects.create(room=world.room, seq=2, role="assistant", author_name="A", reply_to=question)
        Message.objects.filter(pk__in=[question.pk, old.pk]).update(
            created_at=budgets.month_start().replace(year=2020), tokens=10_000, prompt_tokens=10_000
        )
        Room.objects.filter(pk=world.room.pk).update(last_seq=2)

    await database_sync_to_async(old_use)()
    async with member(world.alice) as alice:
        await alice.post("@a a new month")
        await alice.until(lambda f: all_final(f, 1))
        assert alice.frames.errors == []


@live
async def test_the_header_shows_what_is_left_after_each_reply(world: World) -> None:
    await database_sync_to_async(set_budget)(world, tokens=100_000, cost=Decimal("5.00"))
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.post("@a count me")
        await alice.until(lambda f: all_final(f, 1) and bool(budget_frames(alice)))
        await bob.until(lambda f: bool(budget_frames(bob)))
    used = await database_sync_to_async(used_tokens)(world)
    (shown,) = budget_frames(bob)
    assert shown["data-tokens-left"] == str(100_000 - used)
    assert shown["data-cost-left"] == "5.0000"  # the simulated provider is free
    assert shown["data-resets"] == budgets.resets_on().isoformat()


@memory
async def test_a_room_without_a_budget_sends_no_budget_frame(world: World) -> None:
    async with member(world.alice) as alice:
        await alice.post("@a hi")
        await alice.until(lambda f: all_final(f, 1))
    assert budget_frames(alice) == []


@memory
async def test_a_reply_in_a_room_known_to_have_no_budget_reads_nothing_for_it(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from collab.chat.generation import registry
    from collab.chat.replies import early

    read: list[int] = []
    frame_of = budgets._frame
    monkeypatch.setattr(budgets, "_frame", lambda room_id: read.append(room_id) or frame_of(room_id))
    async with member(world.alice) as alice:
        await alice.post("@a hi")
        await alice.until(lambda f: all_final(f, 1))
        assert early.known(world.room.pk) is not None  # its post read the room: this process knows it
        read.clear()
        await alice.post("@a again")
        await alice.until(lambda f: all_final(f, 2))
        await registry.wait_idle()  # the reply's end, its announce included, is done
    assert read == [] and budget_frames(alice) == []


@memory
async def test_a_budget_set_on_a_known_room_is_shown_after_the_next_reply(world: World) -> None:
    """The admin saves the room: every process forgets what it knew of it (chat/replies/early.py),
    so the next reply's end reads the budget and shows it."""
    from collab.chat.replies import early

    async with member(world.alice) as alice:
        await alice.post("@a hi")
        await alice.until(lambda f: all_final(f, 1))
        assert early.known(world.room.pk) is not None

        def save_budget() -> None:
            room = Room.objects.get(pk=world.room.pk)
            room.budget_tokens = 100_000
            room.save()

        await database_sync_to_async(save_budget)()
        assert early.known(world.room.pk) is None  # forgotten on the save's commit, before any post reads it again
        await alice.post("@a again")
        await alice.until(lambda f: all_final(f, 2) and bool(budget_frames(alice)))
    (shown,) = budget_frames(alice)
    assert shown["data-tokens-left"] == str(100_000 - await database_sync_to_async(used_tokens)(world))


@memory
def test_the_room_page_shows_it_and_the_owner_sees_it_on_the_settings_page(world: World) -> None:
    set_budget(world, tokens=1234)
    client = Client()
    client.force_login(world.alice)
    page = client.get("/r/lab/").content.decode()
    assert 'data-tokens-left="1234"' in page and "1234 tokens" in page
    settings_page = client.get("/r/lab/settings/").content.decode()
    assert 'id="budget-settings"' in settings_page and "of 1234 tokens" in settings_page
    Membership.objects.filter(room=world.room, user=world.bob).update(role=Membership.Role.MODERATOR)
    moderator = Client()
    moderator.force_login(world.bob)
    assert 'id="budget-settings"' not in moderator.get("/r/lab/settings/").content.decode()


def admin_form(client: Client, room: Room, **changes: str) -> dict[str, Any]:
    """The admin's change form of `room` as the page fills it in, with `changes`."""
    page = client.get(f"/admin/chat/room/{room.pk}/change/")
    data: dict[str, Any] = {}

    def add(form: Any) -> None:
        for field in form:
            value = field.value()
            if value is None or value is False:
                continue
            if value is True:
                data[field.html_name] = "on"
            elif isinstance(value, list | tuple):
                data[field.html_name] = [str(v) for v in value]
            else:
                data[field.html_name] = str(value)

    add(page.context["adminform"].form)
    for inline in page.context["inline_admin_formsets"]:
        add(inline.formset.management_form)
        for form in inline.formset.forms:
            add(form)
    data.update(changes)
    return data


@live
async def test_staff_raise_the_budget_in_the_admin_audited_and_shown_live(world: World, sim: tuple[str, Any]) -> None:
    await database_sync_to_async(set_budget)(world, tokens=1)
    root = await database_sync_to_async(User.objects.create_superuser)("root", password="pw-root-123")

    def raise_it() -> int:
        client = Client()
        client.force_login(root)
        room = Room.objects.get(pk=world.room.pk)
        response = client.post(f"/admin/chat/room/{room.pk}/change/", admin_form(client, room, budget_tokens="500000"))
        return response.status_code

    def spend() -> None:
        question = Message.objects.create(room=world.room, seq=1, role="user", author=world.alice, text="earlier")
        Message.objects.create(room=world.room, seq=2, role="assistant", author_name="A", reply_to=question, tokens=5)
        Room.objects.filter(pk=world.room.pk).update(last_seq=2)

    await database_sync_to_async(spend)()
    async with member(world.alice) as alice:
        await alice.post("@a refused")
        await alice.until(lambda f: bool(f.errors))
        assert alice.frames.errors[0][0] == "room.budget"
        assert await sync_to_async(raise_it)() == 302
        await alice.until(lambda f: bool(budget_frames(alice)))
        assert budget_frames(alice)[-1]["data-tokens-left"] == str(500_000 - 5)
        await alice.post("@a now it works")
        await alice.until(lambda f: all_final(f, 1))  # the only reply streamed to this socket

    def audited() -> list[tuple[str, str, str]]:
        return list(AuditEntry.objects.values_list("actor_name", "action", "detail"))

    assert await database_sync_to_async(audited)() == [("root", "budget", "tokens 1 -> 500000")]


def test_a_reply_continued_this_month_counts_this_month(world: World) -> None:
    """A reply asked last month and continued this month (its row holds both requests'
    usage) counts now: else continuing old replies would never spend the budget."""
    set_budget(world, tokens=100)
    question = Message.objects.create(room=world.room, seq=1, role="user", author=world.alice, text="earlier")
    reply = Message.objects.create(room=world.room, seq=2, role="assistant", author_name="A", reply_to=question)
    last_month = budgets.month_start().replace(year=2020)
    Message.objects.filter(pk__in=[question.pk, reply.pk]).update(created_at=last_month)
    Message.objects.filter(pk=reply.pk).update(tokens=150, prompt_tokens=0, finished_at=last_month)
    room = Room.objects.get(pk=world.room.pk)
    assert budgets.usage(room).used_tokens == 0  # asked and ended last month
    Message.objects.filter(pk=reply.pk).update(finished_at=timezone.now())
    assert budgets.usage(room).used_tokens == 150 and budgets.usage(room).spent  # continued this month
