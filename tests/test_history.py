"""A room's history over HTTP (docs/wire.md, "HTTP"): search (PostgreSQL full-text search
there, a case-insensitive match on SQLite: these tests pass on both), a message in
context, and the transcript as Markdown and JSON, streamed. Members only; never another
member's personal reply (made here directly in the database); the exporter's own is in."""

from __future__ import annotations

import io
import json
import zipfile
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.db import connection
from django.test import AsyncClient, Client
from django.utils import timezone

from collab.chat.models import Assistant, Ban, Membership, Message, Provider, Room
from collab.chat.services import history

pytestmark = pytest.mark.django_db


@pytest.fixture
def people() -> dict[str, User]:
    return {
        name: User.objects.create_user(name, password=f"pw-{name}-123")
        for name in ("alice", "bob", "carol", "dave", "staff")
    }


@pytest.fixture
def room(people: dict[str, User]) -> Room:
    the_room = Room.objects.create(name="Lab", slug="lab", owner=people["alice"])
    Membership.objects.create(room=the_room, user=people["alice"], role=Membership.Role.OWNER)
    Membership.objects.create(room=the_room, user=people["bob"])
    Ban.objects.create(room=the_room, user=people["dave"])
    people["staff"].is_staff = True
    people["staff"].save()
    return the_room


@pytest.fixture
def assistant() -> Assistant:
    provider = Provider.objects.create(name="sim", base_url="http://127.0.0.1:9/v1", default_model="sim")
    return Assistant.objects.create(handle="a", display_name="A", provider=provider)


def put(room: Room, author: User | None, text: str, **kw: Any) -> Message:
    seq = Room.objects.get(pk=room.pk).last_seq + 1
    Room.objects.filter(pk=room.pk).update(last_seq=seq)
    role = "assistant" if author is None else "user"
    name = author.get_username() if author is not None else "A"
    return Message.objects.create(room=room, seq=seq, role=role, author=author, author_name=name, text=text, **kw)


def client(user: User) -> Client:
    c = Client()
    c.force_login(user)
    return c


def exported(user: User, url: str) -> tuple[Any, bytes, int]:
    """The response, its body and how many chunks it came in, read as Daphne does (ASGI:
    the streamed body is an async iterator)."""

    async def get() -> tuple[Any, bytes, int]:
        c = AsyncClient()
        await c.aforce_login(user)
        response = await c.get(url)
        if not response.streaming:
            return response, response.content, 1
        chunks = [chunk async for chunk in response.streaming_content]
        return response, b"".join(chunks), len(chunks)

    return async_to_sync(get)()


# --- search -------------------------------------------------------------------------------


def test_search_finds_a_members_messages_newest_first_highlighted_and_escaped(
    room: Room, people: dict[str, User], assistant: Assistant
) -> None:
    older = put(room, people["alice"], "the needle is in the haystack")
    put(room, people["bob"], "nothing to see here")
    answer = put(room, None, "a <script>alert(1)</script> needle, says the model", assistant=assistant)
    page = client(people["bob"]).get("/r/lab/search", {"q": "needle"})
    assert page.status_code == 200
    body = page.content.decode()
    assert "<script>" not in body and "<mark>needle</mark>" in body
    found = [m.pk for m, _ in page.context["results"]]
    assert found == [answer.pk, older.pk]  # newest first
    assert f'href="/r/lab/?at={older.seq}#msg-{older.pk}"' in body
    assert 'data-count="2"' in body


def test_search_never_finds_deleted_messages_nor_others_personal_replies(
    room: Room, people: dict[str, User], assistant: Assistant
) -> None:
    shared = put(room, people["alice"], "shared kiwi")
    put(room, people["alice"], "", deleted_at=timezone.now())  # a tombstone: no text left
    gone = put(room, people["alice"], "kiwi once", deleted_at=timezone.now())  # even with text left
    for_bob = put(room, None, "kiwi for bob", assistant=assistant, recipient=people["bob"])
    for_alice = put(room, None, "kiwi for alice", assistant=assistant, recipient=people["alice"])
    as_alice = client(people["alice"]).get("/r/lab/search", {"q": "kiwi"})
    as_bob = client(people["bob"]).get("/r/lab/search", {"q": "kiwi"})
    assert [m.pk for m, _ in as_alice.context["results"]] == [for_alice.pk, shared.pk]
    assert [m.pk for m, _ in as_bob.context["results"]] == [for_bob.pk, shared.pk]
    assert "kiwi for bob" not in as_alice.content.decode() and "kiwi for alice" not in as_bob.content.decode()
    assert gone.pk not in [m.pk for m, _ in as_alice.context["results"]]


def test_search_is_for_members_only(room: Room, people: dict[str, User]) -> None:
    put(room, people["alice"], "a secret plan")
    assert client(people["carol"]).get("/r/lab/search", {"q": "secret"}).status_code == 404
    assert client(people["staff"]).get("/r/lab/search", {"q": "secret"}).status_code == 404  # read-only staff too
    assert client(people["alice"]).get("/r/nowhere/search", {"q": "secret"}).status_code == 404
    banned = client(people["dave"]).get("/r/lab/search", {"q": "secret"})
    assert banned.status_code == 403 and b'data-code="room.banned"' in banned.content
    assert b"secret plan" not in banned.content
    anonymous = Client().get("/r/lab/search", {"q": "secret"})
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")


def test_an_empty_or_too_long_search_says_so(room: Room, people: dict[str, User]) -> None:
    alice = client(people["alice"])
    empty = alice.get("/r/lab/search", {"q": "   "})
    assert empty.status_code == 200 and b'data-code="search.empty"' in empty.content
    assert alice.get("/r/lab/search").status_code == 200
    long = alice.get("/r/lab/search", {"q": "x" * (history.MAX_QUERY_CHARS + 1)})
    assert long.status_code == 400 and b'data-code="search.too_long"' in long.content


def test_search_results_come_in_pages(room: Room, people: dict[str, User]) -> None:
    made = [put(room, people["alice"], f"apple number {i}") for i in range(history.PAGE_SIZE + 5)]
    alice = client(people["alice"])
    first = alice.get("/r/lab/search", {"q": "apple"})
    second = alice.get("/r/lab/search", {"q": "apple", "page": 2})
    ids = [m.pk for m, _ in first.context["results"]] + [m.pk for m, _ in second.context["results"]]
    assert ids == [m.pk for m in reversed(made)]
    assert b'rel="next"' in first.content and b'rel="prev"' in second.content


@pytest.mark.skipif(connection.vendor != "postgresql", reason="full-text search is PostgreSQL's")
def test_postgresql_search_is_full_text(room: Room, people: dict[str, User]) -> None:
    stemmed = put(room, people["alice"], "we deployed the servers yesterday")
    put(room, people["alice"], "deployed the clients, not those")
    page = client(people["alice"]).get("/r/lab/search", {"q": "deploy server -clients"})
    assert [m.pk for m, _ in page.context["results"]] == [stemmed.pk]
    assert "<mark>deployed</mark>" in page.content.decode()


def test_a_result_opens_the_room_at_that_message(room: Room, people: dict[str, User], assistant: Assistant) -> None:
    messages = [put(room, people["alice"], f"line {i}") for i in range(30)]
    put(room, None, "private to bob", assistant=assistant, recipient=people["bob"])
    target = messages[15]
    page = client(people["alice"]).get(f"/r/lab/?at={target.seq}")
    assert page.status_code == 200
    body = page.content.decode()
    shown = [m.pk for m, _ in page.context["articles"]]
    assert target.pk in shown and messages[5].pk in shown and messages[25].pk in shown
    assert messages[0].pk not in shown  # only the messages around it
    assert f'id="msg-{target.pk}"' in body and "ws-connect" not in body  # no live socket here
    end = client(people["alice"]).get(f"/r/lab/?at={messages[-1].seq}").content.decode()
    assert "private to bob" not in end
    assert client(people["carol"]).get(f"/r/lab/?at={target.seq}").status_code == 404
    assert client(people["alice"]).get("/r/lab/?at=x").status_code == 400


# --- export -------------------------------------------------------------------------------


def _transcript(room: Room, people: dict[str, User], assistant: Assistant) -> dict[str, Message]:
    now = timezone.now()
    return {
        "question": put(room, people["alice"], "what is **up**?", edited_at=now + timedelta(seconds=1)),
        "answer": put(room, None, "all is well", assistant=assistant),
        "gone": put(room, people["bob"], "", deleted_at=now),
        "for_alice": put(room, None, "just for alice", assistant=assistant, recipient=people["alice"]),
        "for_bob": put(room, None, "just for bob", assistant=assistant, recipient=people["bob"]),
    }


def test_the_json_export_is_the_members_view_of_the_room(
    room: Room, people: dict[str, User], assistant: Assistant
) -> None:
    made = _transcript(room, people, assistant)
    response, body, _ = exported(people["alice"], "/r/lab/export.json")
    assert response.status_code == 200 and response["Content-Type"].startswith("application/json")
    assert (
        response["Content-Disposition"].startswith('attachment; filename="lab-')
        and ".json" in response["Content-Disposition"]
    )
    data = json.loads(body)
    assert data["room"] == "lab" and data["by"] == "alice"
    lines = data["messages"]
    assert [x["id"] for x in lines] == [made[k].pk for k in ("question", "answer", "gone", "for_alice")]
    question, answer, gone, mine = lines
    assert question["text"] == "what is **up**?" and question["edited"] and not question["deleted"]
    assert answer["assistant"] == "a" and answer["edited"] is None
    assert gone["deleted"] and gone["text"] == ""
    assert mine["recipient"] == "alice" and mine["text"] == "just for alice"
    assert b"just for bob" not in body


def test_the_markdown_export_marks_edits_and_tombstones(
    room: Room, people: dict[str, User], assistant: Assistant
) -> None:
    made = _transcript(room, people, assistant)
    response, body, _ = exported(people["bob"], "/r/lab/export.md")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/markdown")
    assert "attachment" in response["Content-Disposition"] and ".md" in response["Content-Disposition"]
    text = body.decode()
    assert text.startswith("# Lab (lab)")
    assert "what is **up**?" in text and "_(edited " in text
    assert f"### #{made['gone'].seq} bob · user, deleted" in text
    assert (
        "just for bob" in text
        and f"### #{made['for_bob'].seq} A (@a) · assistant, done · " in text
        and " · for bob only" in text
    )
    assert "just for alice" not in text
    positions = [text.index(f"### #{m.seq} ") for k, m in made.items() if k != "for_alice"]
    assert positions == sorted(positions)


# Every export says whose a personal reply is (issue 33, item 6): the admin's zip (.jsonl
# and .md) and a member's own export (.json and .md) carry `recipient` (a username, or null
# for a room message), and the Markdown says "for NAME only".


def _room_with_personal_replies(room: Room, people: dict[str, User], assistant: Assistant) -> dict[str, int]:
    return {
        "question": put(room, people["alice"], "/each @a how do we ship?").seq,
        "shared": put(room, None, "ship on Friday", assistant=assistant).seq,
        "for_bob": put(room, None, "bob: ship the docs", assistant=assistant, recipient=people["bob"]).seq,
        "for_alice": put(room, None, "alice: ship the code", assistant=assistant, recipient=people["alice"]).seq,
    }


def test_the_admin_export_says_whose_each_personal_reply_is(
    room: Room, people: dict[str, User], assistant: Assistant
) -> None:
    seqs = _room_with_personal_replies(room, people, assistant)
    root = User.objects.create_user("root", is_staff=True, is_superuser=True)
    staff = Client()
    staff.force_login(root)
    response = staff.post("/admin/chat/room/", {"action": "export", "_selected_action": [str(room.pk)]})
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    archive = zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content)))
    lines = {x["seq"]: x for x in map(json.loads, archive.read("lab.jsonl").decode().splitlines())}
    assert {seq: lines[seq]["recipient"] for seq in seqs.values()} == {
        seqs["question"]: None,
        seqs["shared"]: None,
        seqs["for_bob"]: "bob",
        seqs["for_alice"]: "alice",
    }
    markdown = archive.read("lab.md").decode()
    heads = {line.split(" ")[1]: line for line in markdown.splitlines() if line.startswith("### #")}
    assert "for bob only" in heads[f"#{seqs['for_bob']}"]
    assert "for alice only" in heads[f"#{seqs['for_alice']}"]
    assert " only" not in heads[f"#{seqs['shared']}"] and " only" not in heads[f"#{seqs['question']}"]


@pytest.mark.parametrize("fmt", ["md", "json"])
def test_a_members_export_says_the_personal_reply_is_theirs(
    room: Room, people: dict[str, User], assistant: Assistant, fmt: str
) -> None:
    seqs = _room_with_personal_replies(room, people, assistant)
    response, body, _ = exported(people["bob"], f"/r/lab/export.{fmt}")
    assert response.status_code == 200
    assert b"alice: ship the code" not in body  # never another member's personal reply
    if fmt == "json":
        lines = {x["seq"]: x for x in json.loads(body)["messages"]}
        assert lines[seqs["for_bob"]]["recipient"] == "bob" and lines[seqs["shared"]]["recipient"] is None
        return
    heads = {line.split(" ")[1]: line for line in body.decode().splitlines() if line.startswith("### #")}
    assert "for bob only" in heads[f"#{seqs['for_bob']}"] and " only" not in heads[f"#{seqs['shared']}"]


def test_the_export_is_for_members_only(room: Room, people: dict[str, User]) -> None:
    put(room, people["alice"], "members' business")
    for fmt in ("md", "json"):
        assert exported(people["carol"], f"/r/lab/export.{fmt}")[0].status_code == 404
        assert exported(people["staff"], f"/r/lab/export.{fmt}")[0].status_code == 404
        banned, body, _ = exported(people["dave"], f"/r/lab/export.{fmt}")
        assert banned.status_code == 403 and b"members' business" not in body
    assert exported(people["alice"], "/r/lab/export.txt")[0].status_code == 404
    assert Client().get("/r/lab/export.md").status_code == 302


def test_a_large_room_is_exported_in_pieces(room: Room, people: dict[str, User]) -> None:
    Message.objects.bulk_create(
        Message(room=room, seq=i, role="user", author=people["alice"], author_name="alice", text=f"message {i}")
        for i in range(1, 1301)
    )
    Room.objects.filter(pk=room.pk).update(last_seq=1300)
    _, body, chunks = exported(people["alice"], "/r/lab/export.json")
    assert len(json.loads(body)["messages"]) == 1300
    assert chunks > 1300  # a line at a time, not the room built in memory
    _, markdown, md_chunks = exported(people["alice"], "/r/lab/export.md")
    assert markdown.decode().count("\n### #") == 1300 and md_chunks > 1300


def test_the_room_page_links_search_and_export(room: Room, people: dict[str, User]) -> None:
    body = client(people["bob"]).get("/r/lab/").content.decode()
    assert (
        'action="/r/lab/search"' in body and 'href="/r/lab/export.md"' in body and 'href="/r/lab/export.json"' in body
    )
    assert '.room .msg[data-author="bob"] .act.edit' in body  # Edit and Delete show on bob's own messages only


@pytest.mark.parametrize("fmt", ["json", "md"])
def test_exports_say_whose_a_shared_reply_was_and_what_a_merge_drew_from(
    room: Room, people: dict[str, User], assistant: Assistant, fmt: str
) -> None:
    question = put(room, people["alice"], "/each @a how do we ship?")
    shared = put(room, None, "ship the docs", assistant=assistant, made_for="bob", lens="be brief", reply_to=question)
    other = put(room, None, "ship on Friday", assistant=assistant, reply_to=question)
    merge = put(
        room, None, "both", assistant=assistant, merge_of=[shared.pk, other.pk], merge_seqs=[shared.seq, other.seq]
    )
    _, body, _ = exported(people["alice"], f"/r/lab/export.{fmt}")
    if fmt == "json":
        lines = {x["seq"]: x for x in json.loads(body)["messages"]}
        assert (lines[shared.seq]["made_for"], lines[shared.seq]["lens"]) == ("bob", "be brief")
        assert lines[shared.seq]["recipient"] is None and lines[other.seq]["made_for"] is None
        assert lines[merge.seq]["merged_from"] == [shared.seq, other.seq] and lines[other.seq]["merged_from"] is None
        return
    text = body.decode()
    heads = {line.split(" ")[1]: line for line in text.splitlines() if line.startswith("### #")}
    assert heads[f"#{shared.seq}"].endswith("· for bob, shared") and "> lens: be brief" in text
    assert f"> merged from #{shared.seq}, #{other.seq}" in text
