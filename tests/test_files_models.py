"""What models see of a room's files (issue 36; docs/architecture/files.md, "What models
see"): a message's images and documents reach the model's request over the real openai
client and the simulated model, whose record and proof line say what arrived; an
assistant that cannot see gets a note; a long document is cut to the parts that match
the question (ranked by PostgreSQL's full-text search, or SQLite's simpler match: the
PostgreSQL pass runs these too); an agent's read_file and search_files see only what the
run may see; images by signed link expire and cannot be forged.

Files are made as rows (Attachment, AttachmentPart) on a message, as posting stores them:
the upload and the post are other tests' (tests/test_files_*.py)."""

from __future__ import annotations

import io
from typing import Any
from unittest import mock

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.core.files.base import ContentFile
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from PIL import Image

from collab.chat.context import HistoryRow, build_context
from collab.chat.file_models import Attachment, AttachmentPart
from collab.chat.files.for_models import IMAGE_PARTS, read_files
from collab.chat.models import Assistant, Membership, Message, Room
from collab.chat.replies.jobs import read_history, reply_jobs
from collab.chat.replies.tools import BUILTINS, Toolbox
from collab.llm.content import content_text
from tests.conftest import World, make_assistant, member
from tests.test_agents import run_to_end

pytestmark = [pytest.mark.django_db(transaction=True)]

PART_CHARS = 2000


def png(width: int, height: int, color: str = "red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def image(name: str, data: bytes) -> dict[str, Any]:
    with Image.open(io.BytesIO(data)) as shown:
        width, height = shown.size
    return {
        "name": name,
        "kind": "image",
        "content_type": "image/png",
        "size": len(data),
        "file": ContentFile(data, name),
        "width": width,
        "height": height,
    }


def document(name: str, pages: list[str], content_type: str = "text/plain") -> dict[str, Any]:
    text = "".join(pages)
    starts = [sum(len(p) for p in pages[:i]) for i in range(len(pages))]
    return {
        "name": name,
        "kind": "document",
        "content_type": content_type,
        "size": len(text.encode()),
        "file": ContentFile(text.encode(), name),
        "text": text,
        "page_starts": starts,
    }


def posted(room: Room, author: User, text: str, files: list[dict[str, Any]], recipient: User | None = None) -> Message:
    """A message with its files, as a post (or, with `recipient`, a personal reply) stores them."""
    room = Room.objects.get(pk=room.pk)
    room.last_seq += 1
    room.save(update_fields=["last_seq"])
    role = "assistant" if recipient is not None else "user"
    message = Message.objects.create(
        room=room,
        seq=room.last_seq,
        role=role,
        author=author if recipient is None else None,
        author_name=author.username,
        text=text,
        recipient=recipient,
        files=len(files),
    )
    for position, spec in enumerate(files):
        made = Attachment.objects.create(
            room=room, uploader=author, uploader_name=author.username, message=message, position=position, **spec
        )
        if made.kind == "document":  # its parts, as the extraction cuts them
            for n, (page, start, part) in enumerate(_parts(made)):
                AttachmentPart.objects.create(attachment=made, room=room, n=n, page=page, start=start, text=part)
    return message


def _parts(attachment: Attachment) -> list[tuple[int, int, str]]:
    out = []
    for page in range(1, attachment.pages + 1):
        begin = attachment.page_starts[page - 1]
        text = attachment.page_text(page)
        for at in range(0, len(text), PART_CHARS):
            out.append((page, begin + at, text[at : at + PART_CHARS]))
    return out


def request_with(sim: Any, marker: str) -> dict[str, Any]:
    return next(r for r in reversed(sim[1].recorded) if marker in str(r["messages"]))


def sent_text(request: dict[str, Any]) -> str:
    return "\n".join(content_text(m.get("content")) for m in request["messages"])


NOTES = "Kickoff is on Tuesday at the blue office, bring the badges."


@pytest.mark.usefixtures("memory_layer", "replies_idle")
async def test_a_vision_assistant_is_sent_the_image_and_the_document_text(world: World, sim: Any) -> None:
    shot = png(64, 48)
    files = [image("shot.png", shot), document("notes.txt", [NOTES])]
    await database_sync_to_async(posted)(world.room, world.alice, "the screen and the notes", files)
    async with member(world.alice) as alice:
        stored = await run_to_end(alice, "@a what do you see here?")
    request = request_with(sim, "what do you see here?")
    # The image arrived as an image part, a data URL of the stored bytes.
    assert request["images"] == [{"media_type": "image/png", "size": len(shot), "width": 64, "height": 48, "url": ""}]
    [turn] = [m for m in request["messages"] if isinstance(m.get("content"), list)]
    assert turn["content"][1] == {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,<{len(shot)} bytes>"},
    }
    text = sent_text(request)
    assert "alice: the screen and the notes" in text
    assert f"[image 1 attached: shot.png, image/png, {len(shot)} bytes, 64x48]" in text
    assert f"[file notes.txt: text/plain, 1 page, whole]\n{NOTES}\n[end of file notes.txt]" in text
    # The simulated model's reply starts with the line that proves what it got.
    assert stored.text.startswith(
        f'Received 1 image: image/png {len(shot)} bytes 64x48. Documents: notes.txt "Kickoff is on Tuesday at the…".'
    )


@pytest.mark.usefixtures("memory_layer", "replies_idle")
async def test_an_assistant_that_cannot_see_is_told_an_image_was_attached(world: World, sim: Any) -> None:
    blind = world.assistants["b"]
    blind.vision = False
    await database_sync_to_async(blind.save)()
    shot = png(30, 20)
    await database_sync_to_async(posted)(world.room, world.alice, "look", [image("shot.png", shot)])
    async with member(world.alice) as alice:
        stored = await run_to_end(alice, "@b what is in the picture?")
    request = request_with(sim, "what is in the picture?")
    assert "images" not in request
    assert all(isinstance(m["content"], str) for m in request["messages"])  # no part for it at all
    note = f"alice: look\n\n[image attached: shot.png, image/png, {len(shot)} bytes, 30x20 — you cannot see images]"
    assert note in sent_text(request)
    assert not stored.text.startswith("Received")  # it received no image


def test_the_embedded_model_and_older_images_get_notes(world: World) -> None:
    room = world.room
    for i in range(IMAGE_PARTS + 1):  # one image more than are sent as parts
        question = posted(room, world.alice, f"shot {i}", [image(f"s{i}.png", png(10 + i, 10))])
    rows = read_history(room, question)
    files = read_files(rows, [12_000])
    sees = build_context(world.assistants["a"], room, rows, 12_000, "", files)
    parts = [p for m in sees for p in (m["content"] if isinstance(m["content"], list) else [])]
    assert sum(1 for p in parts if p["type"] == "image_url") == IMAGE_PARTS
    assert f"[image attached: s0.png, image/png, {len(png(10, 10))} bytes, 10x10 — not shown: only the newest" in str(
        sees
    )
    local = make_assistant(world.provider, "tiny", model="smollm2-135m-instruct")
    told = build_context(local, room, rows, 12_000, "", files)
    assert all(isinstance(m["content"], str) for m in told)
    assert str(told).count("you cannot see images]") == IMAGE_PARTS + 1


def test_each_context_takes_a_document_as_its_budget_allows(world: World) -> None:
    """One read for both replies: whole for the large context, the matching page for the small one."""
    pages = [f"Chapter {n}: " + ("filler words here. " * 50) for n in (1, 2, 3)]
    pages[1] = "The otter budget is approved. " + pages[1]
    posted(world.room, world.alice, "report", [document("report.txt", pages)])
    question = posted(world.room, world.alice, "@a @b is the otter budget approved?", [])
    rows = read_history(world.room, question)
    files = read_files(rows, [12_000, 2_400])
    large = str(build_context(world.assistants["a"], world.room, rows, 12_000, "", files))
    small = str(build_context(world.assistants["b"], world.room, rows, 2_400, "", files))
    assert "[file report.txt: text/plain, 3 pages, whole]" in large
    assert "the parts that match the question: pages 2 of 3" in small and "The otter budget is approved." in small
    assert "Chapter 1" not in small and "Chapter 3" not in small


def test_a_personal_messages_file_reaches_no_shared_context(world: World) -> None:
    posted(world.room, world.alice, "for bob", [document("bob.txt", ["bob's heron secret"])], world.bob)
    question = posted(world.room, world.alice, "@a what is the heron secret?", [])
    rows = read_history(world.room, question)
    sent = str(build_context(world.assistants["a"], world.room, rows, 12_000, "", read_files(rows, [12_000])))
    assert "heron secret?" in sent and "bob.txt" not in sent and "bob's heron secret" not in sent


@pytest.mark.usefixtures("memory_layer", "replies_idle")
async def test_a_history_with_files_is_not_guessed_early(world: World) -> None:
    """An early request (replies/early.py) could not hold the files' parts: none is sent."""
    from collab.chat.replies import early

    plain = HistoryRow(1, 1, "user", "done", "see", "alice", None, None, "", 0, 0, [])
    a = await Assistant.objects.select_related("provider").aget(pk=world.assistants["a"].pk)
    guesses = early.guess(early.Known(world.room, (a,), (plain,)), [a], "alice", "@a and?")
    assert len(guesses) == 1  # guessed: the files are what stops it below
    early.adopt(guesses, [])  # cancelled
    with_file = plain._replace(files=1)
    assert early.guess(early.Known(world.room, (a,), (with_file,)), [a], "alice", "@a and?") == []


def test_a_post_without_files_reads_no_attachment(world: World) -> None:
    """The hot path: a history none of whose messages has files costs no query for them."""
    room = world.room
    posted(room, world.bob, "an old post with a file", [image("old.png", png(8, 8))])
    for i in range(3):
        question = posted(room, world.alice, f"plain post {i}", [])
    rows = read_history(room, question)[-3:]  # the window a small budget reads: no files in it
    reply = Message(id=0, room=room, seq=999, role="assistant", assistant=world.assistants["a"], status="streaming")
    with CaptureQueriesContext(connection) as queries:
        reply_jobs(room, [reply], question, rows)
    assert not [q for q in queries.captured_queries if "attachment" in q["sql"].lower()]
    with CaptureQueriesContext(connection) as queries:  # the old post's file in the window: read, once
        reply_jobs(room, [reply], question)
    assert len([q for q in queries.captured_queries if "attachment" in q["sql"].lower()]) == 1


def long_spec() -> list[str]:
    pages = [f"Page {p} talks about gardening and weather in general terms. " * 50 for p in range(1, 13)]
    for p in (3, 7):
        pages[p - 1] = f"The zebra invoice on page {p} is payable within 30 days. " + pages[p - 1]
    return pages


@pytest.mark.usefixtures("memory_layer", "replies_idle")
async def test_a_long_document_is_cut_to_the_parts_that_match_the_question(world: World, sim: Any) -> None:
    pages = long_spec()
    assert len("".join(pages)) > settings.COLLAB["CONTEXT_CHARS"] * 2
    await database_sync_to_async(posted)(
        world.room, world.bob, "the spec", [document("spec.pdf", pages, "application/pdf")]
    )
    async with member(world.alice) as alice:
        stored = await run_to_end(alice, "@a when is the zebra invoice payable?")
    text = sent_text(request_with(sim, "zebra invoice payable?"))
    assert "[file spec.pdf: application/pdf, 12 pages; the parts that match the question: pages 3, 7 of 12" in text
    assert "[page 3]\nThe zebra invoice on page 3 is payable" in text
    assert "[page 7]\nThe zebra invoice on page 7 is payable" in text
    assert "Page 5 talks" not in text and "Page 12 talks" not in text  # the rest is left out
    assert len(text) < settings.COLLAB["CONTEXT_CHARS"] + 2000  # within the budget (and the system prompt)
    assert (
        'Documents: spec.pdf page 3 "The zebra invoice on page 3…"; spec.pdf page 7 "The zebra invoice' in stored.text
    )


# --- images by signed link (Provider.image_delivery "url") ------------------------------------


@pytest.mark.usefixtures("memory_layer", "replies_idle")
async def test_images_by_signed_link_are_served_and_expire(world: World, sim: Any, settings: Any) -> None:
    settings.COLLAB_PUBLIC_URL = "http://testserver"
    world.provider.image_delivery = "url"
    await database_sync_to_async(world.provider.save)()
    shot = png(12, 9)
    await database_sync_to_async(posted)(world.room, world.alice, "linked", [image("shot.png", shot)])
    async with member(world.alice) as alice:
        await run_to_end(alice, "@a and by link?")
    [sent] = request_with(sim, "and by link?")["images"]
    assert sent["media_type"] == "url" and sent["url"].startswith("http://testserver/files/s/")
    path = sent["url"].removeprefix("http://testserver")

    def fetch(url: str) -> Any:
        return Client().get(url)  # no login: the token is the permission

    got = await database_sync_to_async(fetch)(path)
    assert got.status_code == 200 and b"".join(got.streaming_content) == shot
    assert got["Content-Type"] == "image/png" and got["X-Content-Type-Options"] == "nosniff"
    assert got["Content-Disposition"] == 'inline; filename="shot.png"' and "sandbox" in got["Content-Security-Policy"]
    forged = path[:-3] + ("aaa" if not path.endswith("aaa") else "bbb")
    assert (await database_sync_to_async(fetch)(forged)).status_code == 404
    assert (await database_sync_to_async(fetch)("/files/s/1:1ab2c3:notasignature")).status_code == 404
    with mock.patch("collab.chat.files.signing.SIGNED_URL_S", -1):  # its time is up
        assert (await database_sync_to_async(fetch)(path)).status_code == 404


# --- the agents' file tools --------------------------------------------------------------------


def box(room: Room, asker: User, reader: User | None = None) -> Toolbox:
    return Toolbox(room=room, asker_id=asker.pk, reply_id=0, reader_id=reader.pk if reader else None, specs=BUILTINS)


async def call(toolbox: Toolbox, name: str, **args: Any) -> str:
    import json

    return await toolbox.call(name, json.dumps(args))


@pytest.fixture
def filed(world: World) -> dict[str, Any]:
    """The lab's shared spec and screenshot, a personal reply's file for bob, and a file of
    another room alice is a member of."""
    spec = posted(world.room, world.alice, "spec", [document("spec.pdf", long_spec(), "application/pdf")])
    shot = posted(world.room, world.alice, "shot", [image("shot.png", png(64, 48))])
    secret = posted(world.room, world.alice, "for bob", [document("bob.txt", ["bob's zebra secret"])], world.bob)
    vault = Room.objects.create(name="Vault", slug="vault", owner=world.alice)
    Membership.objects.create(room=vault, user=world.alice, role=Membership.Role.OWNER)
    other = posted(vault, world.alice, "elsewhere", [document("other.txt", ["the vault zebra"])])
    ids = {
        name: Attachment.objects.get(message=m).pk
        for name, m in (("spec", spec), ("shot", shot), ("secret", secret), ("other", other))
    }
    return ids


@pytest.mark.usefixtures("memory_layer")
async def test_read_file_reads_pages_and_ranges_of_what_the_run_may_see(world: World, filed: dict[str, int]) -> None:
    shared_run = box(world.room, world.alice)
    text = "".join(long_spec())
    page = await call(shared_run, "read_file", file=filed["spec"], page=7)
    assert page.startswith(f"file {filed['spec']}: spec.pdf (application/pdf, ") and ", page 7 of 12, " in page
    assert "\nThe zebra invoice on page 7 is payable" in page and page.endswith("in general terms. ")
    first = await call(shared_run, "read_file", file=filed["spec"])
    assert first.endswith(
        f"characters 0 to 3,500 of {len(text):,}:\n{text[:3500]}\n… (more: call again with start=3500)"
    )
    ranged = await call(shared_run, "read_file", file=filed["spec"], start=10, end=40)
    assert ranged.endswith(f"characters 10 to 40 of {len(text):,}:\n{text[10:40]}")
    shot = await call(shared_run, "read_file", file=filed["shot"])
    assert shot.startswith(f"file {filed['shot']}: shot.png (image/png, ") and "64x48" in shot
    # Another room's file, and a personal reply's file for bob: as if they did not exist.
    for hidden in ("other", "secret"):
        assert await call(shared_run, "read_file", file=filed[hidden]) == f"no file {filed[hidden]}"
    alices_own = box(world.room, world.alice, world.alice)
    assert await call(alices_own, "read_file", file=filed["secret"]) == f"no file {filed['secret']}"
    bobs_own = box(world.room, world.bob, world.bob)
    assert "bob's zebra secret" in await call(bobs_own, "read_file", file=filed["secret"])


@pytest.mark.usefixtures("memory_layer")
async def test_search_files_finds_only_this_rooms_visible_files(world: World, filed: dict[str, int]) -> None:
    found = await call(box(world.room, world.alice), "search_files", query="zebra invoice")
    lines = found.splitlines()
    assert lines[0].startswith(f"file {filed['spec']} spec.pdf, page 3: The zebra invoice on page 3")
    assert any(line.startswith(f"file {filed['spec']} spec.pdf, page 7: ") for line in lines)
    assert "secret" not in found and "vault" not in found
    for_bob = await call(box(world.room, world.bob, world.bob), "search_files", query="zebra secret")
    assert f"file {filed['secret']} bob.txt, page 1: bob's zebra secret" in for_bob
    named = await call(box(world.room, world.alice), "search_files", query="shot")
    assert named.startswith(f"file {filed['shot']} shot.png (image/png, ") and named.endswith("its name matches")
    nothing = await call(box(world.room, world.alice), "search_files", query="vault")
    assert nothing == "no file in lab matches 'vault'"
