"""The room's own settings (docs/wire.md, "room settings"): its system prompt reaches the
model's request from the next reply on (the simulated model, a real server, records what
it was sent); only the owner sets it; and in a room set to reply to every message,
mentioning a person never switches the assistants off."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.test import Client

from collab.chat.models import Message, Room
from tests.conftest import World, all_final, member

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("layer", "replies_idle")]

PROMPT = "Answer like a ship's captain, and never use the word 'maybe'."


@pytest.fixture
def requests_seen(sim: tuple[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[dict[str, Any]]]]:
    """The messages of every completion request the simulated model parses: the real
    request, read where the server reads it (nothing else changes)."""
    app = sim[1]
    seen: list[list[dict[str, Any]]] = []
    parse = app._parse_completion

    def recording(body: bytes) -> Any:
        completion = parse(body)
        seen.append(completion.messages)
        return completion

    monkeypatch.setattr(app, "_parse_completion", recording)
    yield seen


def settings_form(room: Room, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "op": "settings",
        "topic": room.topic,
        "system_prompt": room.system_prompt,
        "assistants": [str(pk) for pk in room.assistants.values_list("pk", flat=True)],
    }
    if room.reply_to_all:
        data["reply_to_all"] = "on"
    data.update(changes)
    return data


def post_settings(user: User, **changes: Any) -> int:
    client = Client()
    client.force_login(user)
    room = Room.objects.get(slug="lab")
    return client.post("/r/lab/settings/", settings_form(room, **changes)).status_code


def system_of(messages: list[dict[str, Any]]) -> str:
    assert messages[0]["role"] == "system"
    return str(messages[0]["content"])


async def test_the_room_prompt_reaches_the_model_from_the_next_reply(
    world: World, requests_seen: list[list[dict[str, Any]]]
) -> None:
    async with member(world.alice) as alice:
        await alice.post("@a before the prompt")
        await alice.until(lambda f: all_final(f, 1))
        assert await sync_to_async(post_settings)(world.alice, system_prompt=PROMPT) == 302
        await alice.post("@a after the prompt")
        await alice.until(lambda f: all_final(f, 2))
    first, second = requests_seen
    assert PROMPT not in system_of(first)
    assert PROMPT in system_of(second)
    assert any("before the prompt" in m["content"] for m in second)  # the history as before
    room = await database_sync_to_async(Room.objects.get)(pk=world.room.pk)
    assert room.system_prompt == PROMPT


async def test_a_regeneration_uses_the_prompt_as_it_is_now(
    world: World, requests_seen: list[list[dict[str, Any]]]
) -> None:
    async with member(world.alice) as alice:
        await alice.post("@a tell me")
        await alice.until(lambda f: all_final(f, 1))
        (reply_id,) = [i for i, r in alice.frames.replies.items() if r.role == "assistant"]
        assert await sync_to_async(post_settings)(world.alice, system_prompt=PROMPT) == 302
        await alice.send(action="regenerate", message_id=reply_id)
        await alice.until(lambda f: all_final(f, 2))
    assert [PROMPT in system_of(r) for r in requests_seen] == [False, True]


def test_only_the_owner_sets_the_room_prompt(world: World) -> None:
    from collab.chat.models import Membership

    Membership.objects.filter(room=world.room, user=world.bob).update(role=Membership.Role.MODERATOR)
    assert post_settings(world.bob, system_prompt="hijacked") == 403  # a moderator
    Membership.objects.filter(room=world.room, user=world.bob).update(role=Membership.Role.MEMBER)
    assert post_settings(world.bob, system_prompt="hijacked") == 403  # a member
    assert Room.objects.get(pk=world.room.pk).system_prompt == ""
    too_long = "x" * 4001
    assert post_settings(world.alice, system_prompt=too_long) == 400  # the form says why
    assert Room.objects.get(pk=world.room.pk).system_prompt == ""


async def test_staff_set_the_room_prompt_in_the_admin(world: World, requests_seen: list[list[dict[str, Any]]]) -> None:
    from tests.test_room_budget import admin_form

    def set_in_admin() -> int:
        root = User.objects.create_superuser("root", password="pw-root-123")
        client = Client()
        client.force_login(root)
        room = Room.objects.get(pk=world.room.pk)
        return client.post(
            f"/admin/chat/room/{room.pk}/change/", admin_form(client, room, system_prompt=PROMPT)
        ).status_code

    assert await sync_to_async(set_in_admin)() == 302
    async with member(world.bob) as bob:
        await bob.post("@b hello")
        await bob.until(lambda f: all_final(f, 1))
    (request,) = requests_seen
    assert PROMPT in system_of(request)


def test_the_settings_page_shows_the_prompt_and_the_reply_mode(world: World) -> None:
    Room.objects.filter(pk=world.room.pk).update(system_prompt=PROMPT, reply_to_all=True)
    client = Client()
    client.force_login(world.alice)
    page = client.get("/r/lab/settings/").content.decode()
    assert 'name="system_prompt"' in page and "never use the word" in page
    assert re.search(r'<input type="radio" name="reply_to_all" value="on"[^>]*checked', page)  # every message
    assert not re.search(r'<input type="radio" name="reply_to_all" value=""[^>]*checked', page)
    assert "on mention" in page


def test_the_owner_switches_the_reply_mode(world: World) -> None:
    assert post_settings(world.alice, reply_to_all="on") == 302
    assert Room.objects.get(pk=world.room.pk).reply_to_all is True
    assert post_settings(world.alice, reply_to_all="") == 302
    assert Room.objects.get(pk=world.room.pk).reply_to_all is False
    assert post_settings(world.alice, reply_to_all="sometimes") == 400  # not a mode: the form says so


# --- reply mode: every message ----------------------------------------------------------------


async def every_message(world: World) -> None:
    await database_sync_to_async(Room.objects.filter(pk=world.room.pk).update)(reply_to_all=True)


def replies_to(text: str) -> list[str]:
    question = Message.objects.get(role=Message.Role.USER, text=text)
    return sorted(question.replies.values_list("assistant__handle", flat=True))


async def test_mentioning_a_person_in_an_every_message_room_still_gets_replies(world: World) -> None:
    await every_message(world)
    async with member(world.alice) as alice:
        await alice.post("@bob what do you think?")
        await alice.until(lambda f: all_final(f, 2))
        assert alice.frames.errors == []  # bob is a member: no "unknown mention"
    assert await database_sync_to_async(replies_to)("@bob what do you think?") == ["a", "b"]


async def test_in_an_every_message_room_a_plain_message_gets_every_assistant_and_a_mention_only_its_own(
    world: World,
) -> None:
    await every_message(world)
    async with member(world.alice) as alice:
        await alice.post("hello room")
        await alice.until(lambda f: all_final(f, 2))
        await alice.post("@a only you, @bob")
        await alice.until(lambda f: all_final(f, 3))
    assert await database_sync_to_async(replies_to)("hello room") == ["a", "b"]
    assert await database_sync_to_async(replies_to)("@a only you, @bob") == ["a"]


async def test_on_mention_a_person_mention_starts_no_reply(world: World) -> None:
    async with member(world.alice) as alice:
        await alice.post("@bob just you")
        await alice.post("@a and now you")  # in order: once its reply ends, the first was handled
        await alice.until(lambda f: all_final(f, 1))
    assert await database_sync_to_async(replies_to)("@bob just you") == []
