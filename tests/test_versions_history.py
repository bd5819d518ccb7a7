"""A reply's versions in the record (docs/wire.md, "regenerate a reply" and "show a
version"; the rows made here directly in the database, as replies/again.py and
commands/versions.py write them): the history a model is sent holds the shown version
alone, in its slot's place; a merge takes the shown version; search finds only what the
room shows; and the exports, the member's (Markdown and JSON) and the admin's, keep every
version, marked."""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import User
from django.test import Client

from collab.chat.models import Message
from collab.chat.replies.jobs import read_history
from collab.chat.services import history
from collab.chat.services.votes import approved_replies
from tests.conftest import World
from tests.test_history import exported

pytestmark = pytest.mark.django_db


@dataclass
class Slot:
    question: Message
    first: Message  # hidden
    note: Message  # posted after the first version, before the others
    second: Message  # shown
    third: Message  # hidden
    later: Message  # a question after it all


def put(world: World, text: str, author: User | None = None, **kw: object) -> Message:
    seq = Message.objects.filter(room=world.room).count() + 1
    a = world.assistants["a"]
    fields = {"role": "user", "author": author, "author_name": author.username} if author else {}
    fields = fields or {"role": "assistant", "assistant": a, "author_name": a.display_name}
    return Message.objects.create(room=world.room, seq=seq, text=text, html=f"<p>{text}</p>", **fields, **kw)  # type: ignore[arg-type]


def slot(world: World) -> Slot:
    """alice's question, asked again twice: version 2 of 3 shown."""
    question = put(world, "which FRUIT?", world.alice)
    first = put(world, "APPLES first", reply_to=question, versions=3, version_hidden=True)
    note = put(world, "a NOTE", world.bob)
    kw = {"reply_to": question, "version_of": first, "slot_seq": first.seq, "versions": 3}
    second = put(world, "BANANAS second", version=2, **kw)
    third = put(world, "CHERRIES third", version=3, version_hidden=True, **kw)
    later = put(world, "and a DRINK?", world.bob)
    return Slot(question, first, note, second, third, later)


def test_the_history_holds_the_shown_version_alone_in_its_slots_place(world: World) -> None:
    s = slot(world)
    assert [r.id for r in read_history(world.room, s.later)] == [s.question.pk, s.second.pk, s.note.pk, s.later.pk]
    # A question answered before the versions were made: the shown version is its answer there too.
    assert [r.id for r in read_history(world.room, s.note)] == [s.question.pk, s.second.pk, s.note.pk]
    assert [r.id for r in read_history(world.room, s.question)] == [s.question.pk]


def test_a_merge_takes_the_shown_version_and_search_finds_what_the_room_shows(world: World) -> None:
    s = slot(world)
    other = put(world, "DATES from b", reply_to=s.question)
    Message.objects.filter(pk__in=[s.first.pk, s.second.pk, s.third.pk, other.pk]).update(
        verdict="approved", votes_up=1
    )
    assert [m.pk for m in approved_replies(s.question)] == [s.second.pk, other.pk]
    found = {m.pk for q in ("APPLES", "BANANAS", "CHERRIES") for m in history.search(world.room, world.alice.pk, q)}
    assert found == {s.second.pk}
    around, _, _ = history.around(world.room, world.alice.pk, s.note.seq)
    assert [m.pk for m in around] == [s.question.pk, s.second.pk, s.note.pk, s.later.pk, other.pk]


def test_the_members_json_export_keeps_every_version_marked(world: World) -> None:
    s = slot(world)
    _, body, _ = exported(world.alice, "/r/lab/export.json")
    records = {r["id"]: r for r in json.loads(body)["messages"]}
    keys = ("version", "versions", "version_of", "shown")
    assert [tuple(records[m.pk][k] for k in keys) for m in (s.first, s.second, s.third)] == [
        (1, 3, None, False),
        (2, 3, s.first.seq, True),
        (3, 3, s.first.seq, False),
    ]
    assert [records[m.pk]["text"] for m in (s.first, s.second, s.third)] == [
        "APPLES first",
        "BANANAS second",
        "CHERRIES third",
    ]
    assert tuple(records[s.note.pk][k] for k in keys) == (None, None, None, True)


def test_the_markdown_exports_say_which_version_each_is(world: World) -> None:
    s = slot(world)
    _, body, _ = exported(world.alice, "/r/lab/export.md")
    root = User.objects.create_user("root", is_staff=True, is_superuser=True)
    staff = Client()
    staff.force_login(root)
    response = staff.post("/admin/chat/room/", {"action": "export", "_selected_action": [str(world.room.pk)]})
    archive = zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content)))
    lines = {x["id"]: x for x in map(json.loads, archive.read("lab.jsonl").decode().splitlines())}
    assert [(lines[m.pk]["version"], lines[m.pk]["shown"]) for m in (s.first, s.second, s.third)] == [
        (1, False),
        (2, True),
        (3, False),
    ]
    for markdown in (body.decode(), archive.read("lab.md").decode()):
        assert "APPLES first\n\n> version 1 of 3\n" in markdown
        assert f"BANANAS second\n\n> version 2 of 3 (shown), asked again from #{s.first.seq}\n" in markdown
        assert f"CHERRIES third\n\n> version 3 of 3, asked again from #{s.first.seq}\n" in markdown
        assert "a NOTE\n\n###" in markdown  # no version line for a message without versions
