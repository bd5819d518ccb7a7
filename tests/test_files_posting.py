"""Files on messages (docs/wire.md, "post" and "Files"): a post names uploads by id; they
are checked and attached as it is stored, shown to every member as thumbnails and cards,
in the snapshot, the thread panel, search and the exports; a deleted message takes its
files and their bytes. Over real sockets (the consumer in-process); the uploads are made
here as the upload view stores them (an Attachment row, its bytes in MEDIA_ROOT). Two
real Daphne processes: tests/test_files_cluster.py."""

from __future__ import annotations

import io
import json
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.core.files.base import ContentFile
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from PIL import Image

from collab.chat import rendering
from collab.chat.errors import ClientError
from collab.chat.file_models import Attachment, AttachmentPart
from collab.chat.models import Membership, Message, Room
from collab.chat.replies import posting
from collab.chat.services import attachments, snapshot
from tests.conftest import World, member
from tests.test_history import exported
from tests.test_pins import refused

pytestmark = pytest.mark.django_db(transaction=True)
sockets = pytest.mark.usefixtures("layer", "replies_idle")  # over each channel layer

THUMB = re.compile(r'<a class="file-thumb" href="([^"]+)"[^>]*data-file="(\d+)"[^>]*><img src="([^"]+)"([^>]*)>')
CARD = re.compile(r'<a class="file-card" href="([^"]+)"[^>]*data-file="(\d+)">(.*?)</a>', re.S)


def png(width: int = 40, height: int = 30) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def upload(room: Room, user: User, name: str = "shot.png", *, data: bytes | None = None, text: str = "") -> Attachment:
    """An upload as the upload view stores it: an image (re-encoded PNG, with its thumb), or
    a document with its extracted text in one part."""
    if name.endswith(".png"):
        data = data or png()
        return Attachment.objects.create(
            room=room,
            uploader=user,
            uploader_name=user.username,
            name=name,
            kind="image",
            content_type="image/png",
            size=len(data),
            file=ContentFile(data, name),
            thumb=ContentFile(data, name),
            width=40,
            height=30,
        )
    data = data or text.encode() or b"%PDF-1.4 a document"
    doc = Attachment.objects.create(
        room=room,
        uploader=user,
        uploader_name=user.username,
        name=name,
        kind="document",
        content_type="application/pdf" if name.endswith(".pdf") else "text/plain",
        size=len(data),
        file=ContentFile(data, name),
        text=text,
        page_starts=[0],
    )
    if text:
        AttachmentPart.objects.create(attachment=doc, room=room, n=0, page=1, start=0, text=text)
    return doc


aupload = database_sync_to_async(upload)


def stored(path: str) -> Path:
    return Path(settings.MEDIA_ROOT) / path


def posted_files(message_id: int) -> list[tuple[int, str, int]]:
    return list(
        Attachment.objects.filter(message_id=message_id).order_by("position").values_list("pk", "name", "position")
    )


@sockets
async def test_a_post_with_files_reaches_every_member_and_the_snapshot(world: World) -> None:
    shot = await aupload(world.room, world.alice, "shot.png")
    spec = await aupload(world.room, world.alice, "spec <v2>.pdf", text="the spec says 42")
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.send(text="what is wrong here?", client_id=str(uuid.uuid4()), files=[shot.pk, spec.pk])
        for m in (alice, bob):
            await m.until(lambda f, m=m: any("file-card" in r for r in m.raw))
        new = [r for r in bob.raw if "file-thumb" in r][-1]
    (question,) = await database_sync_to_async(list)(Message.objects.filter(role="user"))
    assert await database_sync_to_async(posted_files)(question.pk) == [
        (shot.pk, "shot.png", 0),
        (spec.pk, "spec <v2>.pdf", 1),
    ]
    # The thumbnail: a link to the file, the thumb inside, sized, named, lazy; the card:
    # name (escaped), type and size, a link to the file.
    ((href, file_id, src, attrs),) = THUMB.findall(new)
    assert (href, int(file_id), src) == (f"/r/lab/f/{shot.pk}/shot.png", shot.pk, f"/r/lab/f/{shot.pk}/thumb")
    assert 'width="40" height="30" alt="shot.png" loading="lazy"' in attrs
    assert (
        'target="_blank" rel="noopener"' in new
        and f'href="/r/lab/f/{shot.pk}/shot.png"' in new
        and "data-lightbox" in new
    )
    ((href, file_id, inner),) = CARD.findall(new)
    assert int(file_id) == spec.pk and href == f"/r/lab/f/{spec.pk}/spec%20%3Cv2%3E.pdf"
    assert "spec &lt;v2&gt;.pdf" in inner and ">PDF<" in inner and "bytes" in inner and "<v2>" not in new
    assert f'id="msg-{question.pk}-files" class="files many"' in new
    async with member(world.bob) as again:  # a later page: in its snapshot
        assert len(THUMB.findall(again.raw[0])) == 1 and len(CARD.findall(again.raw[0])) == 1


@sockets
async def test_files_alone_are_a_post_and_nothing_at_all_is_not(world: World) -> None:
    shot = await aupload(world.room, world.alice)
    async with member(world.alice) as alice:
        await refused(alice, "message.empty", text="  ")
        await refused(alice, "message.empty", files=[])
        await alice.send(text="", client_id=str(uuid.uuid4()), files=[shot.pk])
        await alice.until(lambda f: any("file-thumb" in r for r in alice.raw))
    (question,) = await database_sync_to_async(list)(Message.objects.filter(role="user"))
    assert question.text == "" and await database_sync_to_async(posted_files)(question.pk) == [(shot.pk, "shot.png", 0)]


@pytest.mark.usefixtures("memory_layer", "replies_idle")  # the checks come before any layer
@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("too_many", "file.too_many"),
        ("too_large", "file.too_large"),
        ("another_members", "file.not_found"),
        ("another_rooms", "file.not_found"),
        ("already_posted", "file.not_found"),
        ("unknown", "file.not_found"),
        ("not_a_list", "file.invalid"),
        ("not_ints", "file.invalid"),
        ("a_bool", "file.invalid"),
        ("twice", "file.invalid"),
        ("zero", "file.invalid"),
    ],
)
async def test_each_bad_file_refuses_the_whole_post(world: World, settings: Any, case: str, code: str) -> None:
    settings.COLLAB = {**settings.COLLAB, "MAX_MESSAGE_FILES": 2, "MAX_MESSAGE_FILE_BYTES": 1000}
    mine = await aupload(world.room, world.alice, "a.txt", text="small")
    other_room = await database_sync_to_async(Room.objects.create)(name="Other", slug="other", owner=world.alice)
    await database_sync_to_async(Membership.objects.create)(room=other_room, user=world.alice)
    files: Any = {
        "too_many": [mine.pk, (await aupload(world.room, world.alice, "b.txt", text="b")).pk, mine.pk + 100],
        "too_large": [mine.pk, (await aupload(world.room, world.alice, "big.txt", data=b"x" * 996)).pk],
        "another_members": [mine.pk, (await aupload(world.room, world.bob, "bobs.txt", text="bob")).pk],
        "another_rooms": [(await aupload(other_room, world.alice, "there.txt", text="there")).pk],
        "already_posted": [mine.pk],
        "unknown": [mine.pk + 1000],
        "not_a_list": str(mine.pk),
        "not_ints": [str(mine.pk)],
        "a_bool": [True],
        "twice": [mine.pk, mine.pk],
        "zero": [0],
    }[case]
    if case == "already_posted":
        await database_sync_to_async(posting.store_post)(world.alice.id, world.room.id, "first", None, files=[mine.pk])
    before = await Message.objects.acount()
    async with member(world.alice) as alice, member(world.bob) as bob:
        await refused(alice, code, text="look", client_id=str(uuid.uuid4()), files=files)
        await bob.assert_silent()
    assert await Message.objects.acount() == before  # nothing stored
    if case != "already_posted":
        assert await Attachment.objects.filter(message__isnull=False).acount() == 0


def test_a_repeated_post_attaches_once(world: World) -> None:
    shot = upload(world.room, world.alice)
    cid = uuid.uuid4()
    first, _, _ = posting.store_post(world.alice.id, world.room.id, "see", cid, files=[shot.pk])
    again, _, _ = posting.store_post(world.alice.id, world.room.id, "see", cid, files=[shot.pk])
    assert first.created and not again.created and again.message.pk == first.message.pk
    assert [f.pk for f in first.files] == [shot.pk] and again.files == []
    assert Message.objects.filter(role="user").count() == 1 and posted_files(first.message.pk) == [
        (shot.pk, "shot.png", 0)
    ]


def test_two_posts_racing_for_one_upload_one_gets_it(world: World) -> None:
    shot = upload(world.room, world.alice)
    start = threading.Barrier(2)
    outcomes: list[object] = []

    def post(text: str) -> None:
        try:
            start.wait()
            result, _, _ = posting.store_post(world.alice.id, world.room.id, text, uuid.uuid4(), files=[shot.pk])
            outcomes.append(result.message.pk)
        except ClientError as exc:
            outcomes.append(exc.code)
        finally:
            connection.close()

    racers = [threading.Thread(target=post, args=(f"mine {i}",)) for i in range(2)]
    for t in racers:
        t.start()
    for t in racers:
        t.join(30)
    assert sorted(outcomes, key=str).count("file.not_found") == 1, outcomes
    (winner,) = [o for o in outcomes if isinstance(o, int)]
    assert list(Message.objects.filter(role="user").values_list("pk", flat=True)) == [winner]
    assert posted_files(winner) == [(shot.pk, "shot.png", 0)]


def test_the_update_takes_only_an_upload_still_free(world: World) -> None:
    """The guard under the lock: a file another post took between claim and attach (a
    database without row locks) refuses the post."""
    shot = upload(world.room, world.alice)
    with transaction.atomic():
        (claimed,) = attachments.claim(world.room.id, world.alice.id, [shot.pk])
        other, _, _ = posting.store_post(world.alice.id, world.room.id, "first", None, files=[shot.pk])
        late = Message.objects.create(room=world.room, seq=99, role="user", author_name="alice", text="late")
        with pytest.raises(ClientError) as refused_:
            attachments.attach(late, [claimed])
    assert refused_.value.code == "file.not_found" and posted_files(other.message.pk) == [(shot.pk, "shot.png", 0)]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks are PostgreSQL's")
def test_a_claimed_upload_is_locked_until_its_post_commits(world: World) -> None:
    """A post that reads an upload another post has claimed waits for that post's commit,
    then finds it taken: the first claimer wins, whoever writes first."""
    shot = upload(world.room, world.alice)
    claimed, outcome = threading.Event(), []

    def second() -> None:
        claimed.wait(10)
        try:
            posting.store_post(world.alice.id, world.room.id, "second", None, files=[shot.pk])
            outcome.append("attached")
        except ClientError as exc:
            outcome.append(exc.code)
        finally:
            connection.close()

    racer = threading.Thread(target=second)
    racer.start()
    with transaction.atomic():
        (file,) = attachments.claim(world.room.id, world.alice.id, [shot.pk])
        claimed.set()
        # The second post waits on the row's lock: an event, polled (the activity view is
        # cached for a transaction: cleared each time).
        with connection.cursor() as cursor:
            waiting = (
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            deadline = time.monotonic() + 20
            while True:
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute(waiting)
                if cursor.fetchone()[0]:
                    break
                assert time.monotonic() < deadline, "the second post never waited for the lock"
        first = Message.objects.create(room=world.room, seq=77, role="user", author_name="alice", text="first")
        attachments.attach(first, [file])
    racer.join(30)
    assert outcome == ["file.not_found"] and posted_files(first.pk) == [(shot.pk, "shot.png", 0)]


@sockets
async def test_a_thread_post_carries_files(world: World) -> None:
    doc = await aupload(world.room, world.bob, "notes.txt", text="thread notes")
    top = await database_sync_to_async(posting.store_post)(world.alice.id, world.room.id, "top", None)
    async with member(world.bob) as bob:
        await bob.send(text="", client_id=str(uuid.uuid4()), thread=top[0].message.pk, files=[doc.pk])
        await bob.until(lambda f: any("file-card" in r and "thread-live" in r for r in bob.raw))
    reply = await Message.objects.filter(thread_id=top[0].message.pk).aget()
    assert await database_sync_to_async(posted_files)(reply.pk) == [(doc.pk, "notes.txt", 0)]
    panel = await database_sync_to_async(Client().get)("/r/lab/t/0/")  # anonymous: refused
    assert panel.status_code in (302, 404)
    c = Client()
    await database_sync_to_async(c.force_login)(world.alice)
    panel = await database_sync_to_async(c.get)(f"/r/lab/t/{top[0].message.pk}/")
    assert panel.status_code == 200 and len(CARD.findall(panel.content.decode())) == 1


@sockets
async def test_deleting_a_message_deletes_its_files_and_their_bytes_editing_keeps_them(world: World) -> None:
    shot = await aupload(world.room, world.alice)
    doc = await aupload(world.room, world.alice, "a.txt", text="words")
    paths = [stored(shot.file.name), stored(shot.thumb.name), stored(doc.file.name)]
    assert all(p.exists() for p in paths)
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.send(text="two files", client_id=str(uuid.uuid4()), files=[shot.pk, doc.pk])
        await bob.until(lambda f: any("file-card" in r for r in bob.raw))
        question = await Message.objects.filter(role="user").aget()
        await alice.send(action="edit", message_id=question.pk, text="two files, edited")
        await bob.until(lambda f: any('data-edited="1"' in r for r in bob.raw))
        edited = [r for r in bob.raw if 'data-edited="1"' in r][-1]
        assert len(THUMB.findall(edited)) == 1 and len(CARD.findall(edited)) == 1  # kept
        assert await Attachment.objects.filter(message=question).acount() == 2
        await alice.send(action="delete", message_id=question.pk)
        await bob.until(lambda f: any('data-deleted="1"' in r for r in bob.raw))
        tombstone = [r for r in bob.raw if 'data-deleted="1"' in r][-1]
        assert "file-" not in tombstone
    assert await Attachment.objects.acount() == 0
    assert not any(p.exists() for p in paths)


def test_the_admins_deletion_of_a_message_takes_its_files(world: World) -> None:
    shot = upload(world.room, world.alice)
    result, _, _ = posting.store_post(world.alice.id, world.room.id, "x", None, files=[shot.pk])
    path = stored(shot.file.name)
    staff = User.objects.create_superuser("root", password="pw-root-123")
    c = Client()
    c.force_login(staff)
    page = c.get(f"/admin/chat/message/{result.message.pk}/change/")
    assert page.status_code == 200 and "shot.png" in page.content.decode()
    files = c.get("/admin/chat/attachment/", {"posted": "yes"})
    assert files.status_code == 200 and "shot.png" in files.content.decode()
    response = c.post(f"/admin/chat/message/{result.message.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Attachment.objects.exists() and not path.exists()


def test_the_admin_deletes_an_upload_audited(world: World) -> None:
    doc = upload(world.room, world.bob, "left.txt", text="never posted")
    staff = User.objects.create_superuser("root", password="pw-root-123")
    c = Client()
    c.force_login(staff)
    assert "left.txt" in c.get("/admin/chat/attachment/", {"posted": "no"}).content.decode()
    assert c.post(f"/admin/chat/attachment/{doc.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Attachment.objects.exists() and not stored(doc.file.name).exists()
    from collab.chat.models import AuditEntry

    assert AuditEntry.objects.filter(action="file.delete", room=world.room).count() == 1


def test_search_finds_a_message_by_its_files_name_and_text(world: World) -> None:
    report = upload(world.room, world.alice, "quarterly-report.pdf", text="Revenue grew in the northern region")
    shot = upload(world.room, world.bob, "screenshot.png")
    by_doc, _, _ = posting.store_post(world.alice.id, world.room.id, "", None, files=[report.pk])
    by_img, _, _ = posting.store_post(world.bob.id, world.room.id, "look", None, files=[shot.pk])
    posting.store_post(world.alice.id, world.room.id, "nothing here", None)
    c = Client()
    c.force_login(world.bob)
    found = c.get("/r/lab/search", {"q": "quarterly"})
    assert [m.pk for m, _ in found.context["results"]] == [by_doc.message.pk]
    assert b"<mark>quarterly</mark>-report.pdf" in found.content.lower()
    assert f'href="/r/lab/f/{report.pk}/quarterly-report.pdf"'.encode() in found.content
    found = c.get("/r/lab/search", {"q": "northern region"})
    assert [m.pk for m, _ in found.context["results"]] == [by_doc.message.pk]
    assert b"<mark>northern</mark>" in found.content
    found = c.get("/r/lab/search", {"q": "screenshot"})
    assert [m.pk for m, _ in found.context["results"]] == [by_img.message.pk]
    # A deleted message's files are gone with it: never found.
    Message.objects.filter(pk=by_doc.message.pk).update(deleted_at=by_doc.message.created_at)
    assert c.get("/r/lab/search", {"q": "northern"}).context["results"] == []


def test_the_exports_list_the_files_as_links(world: World) -> None:
    shot = upload(world.room, world.alice, "shot.png")
    doc = upload(world.room, world.alice, "plan [draft].txt", text="plan")
    result, _, _ = posting.store_post(world.alice.id, world.room.id, "", None, files=[shot.pk, doc.pk])
    posting.store_post(world.alice.id, world.room.id, "no files", None)
    _, body, _ = exported(world.bob, "/r/lab/export.json")
    records = json.loads(body)["messages"]
    assert records[0]["files"] == [
        {
            "id": shot.pk,
            "name": "shot.png",
            "kind": "image",
            "content_type": "image/png",
            "size": shot.size,
            "url": f"http://testserver/r/lab/f/{shot.pk}/shot.png",
        },
        {
            "id": doc.pk,
            "name": "plan [draft].txt",
            "kind": "document",
            "content_type": "text/plain",
            "size": 4,
            "url": f"http://testserver/r/lab/f/{doc.pk}/plan%20%5Bdraft%5D.txt",
        },
    ]
    assert records[1]["files"] == [] and records[0]["id"] == result.message.pk
    _, body, _ = exported(world.bob, "/r/lab/export.md")
    text = body.decode()
    assert f"- [shot.png](http://testserver/r/lab/f/{shot.pk}/shot.png) · image/png · {shot.size} bytes" in text
    assert f"- [plan \\[draft\\].txt](http://testserver/r/lab/f/{doc.pk}/plan%20%5Bdraft%5D.txt)" in text


def test_lists_load_their_files_in_one_query(world: World) -> None:
    """The snapshot's read, whatever the number of messages with files: one query more."""
    for i in range(3):
        f = upload(world.room, world.alice, f"s{i}.png")
        posting.store_post(world.alice.id, world.room.id, f"m{i}", None, files=[f.pk])

    def render() -> tuple[int, str]:
        with CaptureQueriesContext(connection) as queries:
            page = snapshot.history(world.room, None, world.alice.id)
        return len(queries), "".join(page.articles)

    three, html = render()
    assert len(THUMB.findall(html)) == 3
    for i in range(3, 8):
        f = upload(world.room, world.alice, f"s{i}.png")
        posting.store_post(world.alice.id, world.room.id, f"m{i}", None, files=[f.pk])
    eight, html = render()
    assert len(THUMB.findall(html)) == 8 and eight == three


def test_the_posts_own_article_renders_without_a_query(world: World) -> None:
    shot = upload(world.room, world.alice)
    result, _, _ = posting.store_post(world.alice.id, world.room.id, "x", None, files=[shot.pk])
    with CaptureQueriesContext(connection) as queries:
        html = rendering.frame_new([result.message])
    assert len(queries) == 0 and len(THUMB.findall(html)) == 1


def test_a_file_is_seen_through_its_message(world: World) -> None:
    """Who may fetch a file (services/attachments.visible, for the file views): the room's
    members, for a posted one; its uploader alone, before it is posted; nobody else, for a
    file of another member's personal message (a person's post is never personal: only
    an assistant's reply is, and replies carry no files; made here directly)."""
    posted = upload(world.room, world.alice, "posted.png")
    posting.store_post(world.alice.id, world.room.id, "x", None, files=[posted.pk])
    upload(world.room, world.alice, "pending.png")  # not posted: its uploader alone
    personal = Message.objects.create(
        room=world.room, seq=50, role="assistant", author_name="a", text="for bob", recipient=world.bob
    )
    private = upload(world.room, world.bob, "private.png")
    Attachment.objects.filter(pk=private.pk).update(message=personal)
    seen = {
        u: set(attachments.visible(world.room.id, u.id).values_list("name", flat=True))
        for u in (world.alice, world.bob)
    }
    assert seen[world.alice] == {"posted.png", "pending.png"}
    assert seen[world.bob] == {"posted.png", "private.png"}
