"""People and models (docs/wire.md, the article's header): avatars are initials on a hue
derived from the name alone, dark enough for AA contrast under white initials whatever the
hue; an assistant's card shows its name, handle, provider and the model it was asked of,
never a key; the picker's list is served to anyone, cached."""

from __future__ import annotations

import colorsys
import importlib
import json
import re
import uuid
from pathlib import Path

from django.apps import apps as django_apps
from django.test import Client

from collab.chat import people
from collab.chat.models import Message, Provider
from collab.chat.replies import posting
from collab.chat.templatetags.people_tags import assistant_card, avatar
from tests.conftest import World, make_assistant

ROOT = Path(__file__).resolve().parent.parent


def _luminance(rgb: tuple[float, float, float]) -> float:
    def channel(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_every_hue_has_aa_contrast_under_white_initials() -> None:
    worst = min(
        1.05 / (_luminance(colorsys.hls_to_rgb(h / 360, people.LIGHTNESS / 100, people.SATURATION / 100)) + 0.05)
        for h in range(360)
    )
    assert worst >= 4.5, worst
    css = (ROOT / "static" / "collab" / "collab.css").read_text()
    assert f"hsl(var(--avatar-hue, 220) {people.SATURATION}% {people.LIGHTNESS}%)" in css  # the CSS draws these


def test_avatars_are_the_same_for_a_name_and_differ_between_names() -> None:
    assert people.initials("Ada Lovelace") == "AL" and people.initials("bob_smith") == "BS"
    assert people.initials("alice") == "A" and people.initials("  ") == "?" and people.initials("élodie") == "É"
    assert people.hue("alice") == people.hue("Alice ") == people.avatar("alice")["hue"]
    assert len({people.hue(n) for n in ("alice", "bob", "carol", "dave", "erin", "frank")}) >= 5
    html = avatar("Ada <b>", role="assistant")
    assert html == (
        f'<span class="avatar bot" style="--avatar-hue: {people.hue("Ada <b>")}" data-initials="A&lt;" aria-hidden="true"></span>'
    )
    assert 'src="/media/a.png"' in avatar("alice", picture="/media/a.png")  # the hook for uploaded pictures


def test_the_card_shows_the_model_that_answered_and_never_a_key(world: World) -> None:
    provider = Provider.objects.create(
        name="acme", base_url="http://127.0.0.1:9/v1", default_model="acme-default", api_key_env="ACME_API_KEY"
    )
    world.room.assistants.add(make_assistant(provider, "helper", model=""))
    _, (reply,), _ = posting.store_post(world.alice.id, world.room.id, "@helper hello", uuid.uuid4())
    stored = Message.objects.get(pk=reply.pk)  # read alone: the card needs no relation
    assert (stored.assistant_handle, stored.provider_name, stored.model) == ("helper", "acme", "acme-default")
    html = assistant_card(stored)
    found = dict(re.findall(r"<dt>(\w+)</dt><dd[^>]*>(.*?)</dd>", html))
    assert found == {
        "assistant": "HELPER",
        "handle": "<code>@helper</code>",
        "provider": "acme",
        "model": "acme-default",
    }
    assert "ACME_API_KEY" not in html
    helper = stored.assistant
    assert helper is not None
    helper.model = "acme-large-2026"
    helper.save()  # the assistant moves on to another model: its earlier replies keep theirs
    assert '<dd class="model">acme-default</dd>' in assistant_card(Message.objects.get(pk=reply.pk))
    stored.model = "acme-large-2026"
    assert '<dd class="model">acme-large-2026</dd>' in assistant_card(stored)


def test_replies_made_before_keep_their_assistants_names(world: World) -> None:
    """The migration fills the handle and provider of every reply made before it."""
    old = Message.objects.create(
        room=world.room, seq=1, role="assistant", author_name="A", assistant=world.assistants["a"], model="sim"
    )
    person = Message.objects.create(room=world.room, seq=2, role="user", author_name="bob", text="hi")
    importlib.import_module("collab.chat.migrations.0022_reactions").keep_names(django_apps, None)
    old.refresh_from_db()
    person.refresh_from_db()
    assert (old.assistant_handle, old.provider_name) == ("a", "sim")
    assert (person.assistant_handle, person.provider_name) == ("", "")


def test_the_emoji_list_is_open_and_cached(db: None) -> None:
    response = Client().get("/emoji.json?v=1")
    assert response.status_code == 200 and "max-age=604800" in response["Cache-Control"]
    body = json.loads(response.content)
    assert body["quick"][0] == "👍" and ["🚀", "rocket", ""] in body["emoji"]
