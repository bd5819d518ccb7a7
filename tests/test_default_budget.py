"""The deployment's default room budget (issue 33, item 2; docs/wire.md, "Budgets"):
COLLAB_DEFAULT_ROOM_BUDGET_TOKENS and _COST apply to every room without a budget of its
own, enforced where a room's own budget is (no upstream call once spent) and shown in
the room's header the same way, marked `data-default="1"`. A room's own budget replaces
it. Real sockets, the simulated model, and the settings read from a real process."""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from collab.chat.models import Message, Room
from collab.chat.services import budgets
from tests.conftest import World, all_final, member, reply_ids
from tests.test_room_budget import budget_frames, completions, set_budget, used_tokens

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("replies_idle")]
live = pytest.mark.usefixtures("layer")
memory = pytest.mark.usefixtures("memory_layer")
ROOT = Path(__file__).resolve().parent.parent


@live
async def test_a_room_without_a_budget_spends_the_default_and_then_no_more(
    world: World, sim: tuple[str, Any], settings: Any
) -> None:
    settings.COLLAB_DEFAULT_ROOM_BUDGET_TOKENS = 50  # one reply spends it
    async with member(world.alice) as alice, member(world.bob) as bob:
        page = await database_sync_to_async(lambda: _room_page(world))()
        assert 'data-tokens-left="50"' in page and 'data-default="1"' in page  # the header shows it
        await alice.post("@a spend it")
        await alice.until(lambda f: all_final(f, 1))
        await alice.until(lambda f: any(b.get("data-spent") == "1" for b in budget_frames(alice)))
        shown = budget_frames(alice)[-1]
        assert shown["data-default"] == "1" and shown["data-tokens-left"] == "0"
        assert await database_sync_to_async(used_tokens)(world) >= 50
        calls = completions(sim)
        await bob.post("@a and now?")
        await bob.until(lambda f: bool(f.errors))
        assert bob.frames.errors[0][0] == "room.budget"
        (reply_id,) = reply_ids(alice.frames)
        await bob.send(action="regenerate", message_id=reply_id)
        await bob.until(lambda f: len(f.errors) == 2)
        assert bob.frames.errors[1][0] == "room.budget"
    assert completions(sim) == calls  # the provider was never called again
    assert await Message.objects.filter(role="assistant").acount() == 1


def _room_page(world: World) -> str:
    client = Client()
    client.force_login(world.alice)
    return client.get("/r/lab/").content.decode()


@memory
async def test_a_rooms_own_budget_replaces_the_default(world: World, sim: tuple[str, Any], settings: Any) -> None:
    settings.COLLAB_DEFAULT_ROOM_BUDGET_TOKENS = 1  # spent by any reply
    settings.COLLAB_DEFAULT_ROOM_BUDGET_COST = Decimal("0.0001")
    await database_sync_to_async(set_budget)(world, tokens=100_000)
    async with member(world.alice) as alice:
        await alice.post("@a one")
        await alice.until(lambda f: all_final(f, 1))
        await alice.post("@a two")  # still within the room's own
        await alice.until(lambda f: all_final(f, 2))
        assert not alice.frames.errors
    room = await Room.objects.aget(pk=world.room.pk)
    budget = await database_sync_to_async(budgets.usage)(room)
    assert (budget.tokens, budget.cost, budget.default) == (100_000, None, False)


@memory
def test_the_default_is_the_settings_and_none_without_them(world: World, settings: Any) -> None:
    room = Room.objects.get(pk=world.room.pk)
    assert not budgets.usage(room).limited
    settings.COLLAB_DEFAULT_ROOM_BUDGET_COST = Decimal("2.50")
    budget = budgets.usage(room)
    assert (budget.tokens, budget.cost, budget.default, budget.limited) == (None, Decimal("2.50"), True, True)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"COLLAB_DEFAULT_ROOM_BUDGET_TOKENS": "250000", "COLLAB_DEFAULT_ROOM_BUDGET_COST": "5"}, "250000 5"),
        ({"COLLAB_DEFAULT_ROOM_BUDGET_TOKENS": "lots"}, "COLLAB_DEFAULT_ROOM_BUDGET_TOKENS"),
        ({"COLLAB_DEFAULT_ROOM_BUDGET_COST": "-1"}, "COLLAB_DEFAULT_ROOM_BUDGET_COST"),
    ],
)
def test_the_default_comes_from_the_environment_and_bad_values_are_said(env: dict[str, str], says: str) -> None:
    code = "from django.conf import settings as s; print(s.COLLAB_DEFAULT_ROOM_BUDGET_TOKENS, s.COLLAB_DEFAULT_ROOM_BUDGET_COST)"
    out = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "collab.settings", "PYTHONPATH": str(ROOT), **env},
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert says in out.stdout + out.stderr


@memory
async def test_staff_set_the_default_in_the_admin_and_it_applies_at_once(
    world: World, sim: tuple[str, Any], settings: Any
) -> None:
    """The admin's Room defaults: staff set the monthly budget of rooms without one (it
    overrides the environment's), the change is audited, and a room spends it and then
    calls no model. A member gets nothing of the admin."""
    from django.contrib.auth.models import User

    from collab.chat.models import AuditEntry, RoomDefaults

    settings.COLLAB_DEFAULT_ROOM_BUDGET_TOKENS = 1_000_000  # the environment's: overridden

    def staff_sets(tokens: str) -> tuple[int, int]:
        staff = User.objects.create_superuser("root", password="pw-root-123")
        client = Client()
        client.force_login(staff)
        listed = client.get("/admin/chat/roomdefaults/")  # one row, made on the first visit
        saved = client.post("/admin/chat/roomdefaults/1/change/", {"budget_tokens": tokens, "budget_cost": ""})
        return listed.status_code, saved.status_code

    def member_tries() -> int:
        client = Client()
        client.force_login(world.alice)
        return client.post("/admin/chat/roomdefaults/1/change/", {"budget_tokens": "", "budget_cost": ""}).status_code

    assert await database_sync_to_async(staff_sets)("50") == (200, 302)
    assert (await RoomDefaults.objects.aget(pk=1)).budget_tokens == 50
    assert await database_sync_to_async(member_tries)() == 302  # to the admin's login: nothing changed
    assert (await RoomDefaults.objects.aget(pk=1)).budget_tokens == 50
    assert await AuditEntry.objects.filter(action="room_defaults.change", actor_name="root").acount() == 1
    room = await Room.objects.aget(pk=world.room.pk)
    budget = await database_sync_to_async(budgets.usage)(room)
    assert (budget.tokens, budget.default) == (50, True)
    async with member(world.alice) as alice:
        await alice.post("@a spend it")
        await alice.until(lambda f: all_final(f, 1))
        calls = completions(sim)
        await alice.post("@a and now?")
        await alice.until(lambda f: bool(f.errors))
        assert alice.frames.errors[0][0] == "room.budget"
    assert completions(sim) == calls
