"""Files over HTTP (docs/wire.md, "Files"; docs/architecture/files.md): the upload's
checks and refusals, what is stored (and that nothing is on any refusal), who may fetch
a file and with which headers, the sweep of uploads never posted, a room's deletion.
In-process (Django's test client) on the test database; files made in tests/file_samples.py."""

from __future__ import annotations

import io
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core.files.base import ContentFile
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from PIL import Image

from collab.chat.file_models import Attachment, AttachmentPart
from collab.chat.files import extract, uploads
from collab.chat.files.sniff import DOCX
from collab.chat.models import Ban, Membership, Message, Room
from collab.chat.services import rooms
from tests import file_samples as samples

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice", password="pw-alice-123")


@pytest.fixture
def bob() -> User:
    return User.objects.create_user("bob", password="pw-bob-123")


@pytest.fixture
def room(alice: User, bob: User) -> Room:
    the_room = rooms.create_room(alice, "Files")
    Membership.objects.create(room=the_room, user=bob)
    return the_room


def client_of(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def upload(client: Client, room: Room, name: str, data: bytes) -> Any:
    return client.post(f"/r/{room.slug}/files/", {"file": SimpleUploadedFile(name, data)})


def get(client: Client, url: str) -> Any:
    """GET, the body read: a FileResponse holds its file open until its content is read
    to the end (the test client then closes it, as a server would)."""
    response = client.get(url)
    response.body = b"".join(response.streaming_content) if response.streaming else response.content
    return response


def stored_files() -> set[Path]:
    """Every file under the media folder (this run's temporary one)."""
    root = Path(django_settings.MEDIA_ROOT)
    return {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def limits(settings: Any, **changed: Any) -> None:
    settings.COLLAB = {**settings.COLLAB, **changed}


def refused(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.content
    assert response.json()["error"]["code"] == code


def post_message(room: Room, author: User, attachment: Attachment, **kw: Any) -> Message:
    seq = rooms.allocate_seqs(room.pk, 1)
    message = Message.objects.create(
        room=room, seq=seq, role="user", author=author, author_name=author.username, text="", **kw
    )
    attachment.message = message
    attachment.save(update_fields=["message"])
    return message


# --- images ------------------------------------------------------------------------------


def test_an_image_is_stored_reencoded_without_its_metadata_and_with_a_thumbnail(
    settings: Any, room: Room, alice: User
) -> None:
    limits(settings, IMAGE_MAX_SIDE=400)
    response = upload(client_of(alice), room, "holiday.jpg", samples.jpeg_with_gps((640, 480)))
    assert response.status_code == 201, response.content
    body = response.json()
    found = Attachment.objects.get(pk=body["id"])
    # Turned as its EXIF said (640x480 shown on its side), then bounded to 400.
    assert (body["width"], body["height"]) == (found.width, found.height) == (300, 400)
    assert body | {"id": 0} == {
        "id": 0,
        "name": "holiday.jpg",
        "kind": "image",
        "content_type": "image/jpeg",
        "size": found.size,
        "url": f"/r/{room.slug}/f/{found.pk}/holiday.jpg",
        "thumb_url": f"/r/{room.slug}/f/{found.pk}/thumb",
        "width": 300,
        "height": 400,
        "pages": None,
        "extract_ms": None,
    }
    with found.file.open("rb") as f:
        stored = Image.open(io.BytesIO(f.read()))
    assert stored.format == "JPEG" and stored.size == (300, 400)
    assert not stored.getexif() and "exif" not in stored.info and "comment" not in stored.info
    with found.thumb.open("rb") as f:
        thumb = Image.open(io.BytesIO(f.read()))
    assert thumb.format == "WEBP" and max(thumb.size) <= 480


def test_a_png_loses_its_text_chunks_and_exif(room: Room, alice: User) -> None:
    response = upload(client_of(alice), room, "shot.png", samples.png_with_text())
    assert response.status_code == 201
    found = Attachment.objects.get(pk=response.json()["id"])
    with found.file.open("rb") as f:
        raw = f.read()
    stored = Image.open(io.BytesIO(raw))
    assert stored.format == "PNG" and stored.mode == "RGBA"
    assert b"someone private" not in raw and b"SpyCam" not in raw and not stored.getexif()


def test_an_animated_gif_stays_animated_bounded_and_without_its_comment(settings: Any, room: Room, alice: User) -> None:
    limits(settings, IMAGE_MAX_SIDE=200)
    response = upload(client_of(alice), room, "dance.gif", samples.animated_gif(3, (400, 300)))
    assert response.status_code == 201, response.content
    found = Attachment.objects.get(pk=response.json()["id"])
    with found.file.open("rb") as f:
        raw = f.read()
    stored = Image.open(io.BytesIO(raw))
    assert (stored.format, stored.n_frames, stored.size) == ("GIF", 3, (200, 150))
    assert b"someone private" not in raw and (found.width, found.height) == (200, 150)


def test_an_animation_counts_all_its_frames_against_the_pixel_limit(settings: Any, room: Room, alice: User) -> None:
    limits(settings, MAX_IMAGE_PIXELS=400 * 300 * 2)  # one frame fits, three do not
    refused(upload(client_of(alice), room, "long.gif", samples.animated_gif(3, (400, 300))), 422, "file.too_complex")


def test_a_pixel_bomb_is_refused_before_it_is_decoded(room: Room, alice: User) -> None:
    before = stored_files()
    refused(upload(client_of(alice), room, "tiny.png", samples.png_pixel_bomb()), 422, "file.too_complex")
    assert not Attachment.objects.exists() and stored_files() == before


# --- types by content --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("cute.png", samples.HTML_AS_PNG),
        ("logo.svg", samples.SVG),
        ("logo.png", samples.SVG),
        ("page.txt", b"  <html><body>hi</body></html>"),
        ("hidden.md", b"<!-- a comment -->\n<svg onload='alert(1)'></svg>"),
        ("binary.txt", b"text\x00with a NUL"),
        ("latin1.txt", "caf\xe9".encode("latin-1")),
        ("archive.docx", samples.docx(["x"])[:30] + b"not a zip"),
        ("program.pdf", b"\x7fELF\x02\x01\x01" + bytes(200)),
    ],
    # Named by the file name alone: a zip's header holds the time it was made, and every
    # pytest-xdist worker must collect the same test ids.
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_what_the_content_is_decides_never_the_extension(room: Room, alice: User, name: str, data: bytes) -> None:
    refused(upload(client_of(alice), room, name, data), 415, "file.type_refused")
    assert not Attachment.objects.exists()


def test_a_pdf_named_as_an_image_is_taken_as_the_pdf_it_is(room: Room, alice: User) -> None:
    response = upload(client_of(alice), room, "photo.png", samples.pdf(["just a spec"]))
    assert response.status_code == 201
    body = response.json()
    assert (body["kind"], body["content_type"], body["name"], body["thumb_url"]) == (
        "document",
        "application/pdf",
        "photo.pdf",
        None,
    )


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("../../etc/passwd", "passwd.txt"),
        ("C:\\Users\\me\\notes.md", "notes.md"),
        ("invoice_\u202efdp.exe", "invoice_fdp.txt"),
        ("bell\x07\x00name.txt", "bellname.txt"),
        ("x" * 500 + ".txt", "x" * 196 + ".txt"),
        ("...", "file.txt"),
    ],
)
def test_names_are_made_safe(raw: str, shown: str) -> None:
    ext = shown.rsplit(".", 1)[1]
    assert uploads.safe_name(raw, ext) == shown


# --- documents ---------------------------------------------------------------------------


def test_a_pdf_text_is_extracted_by_page_and_cut_into_parts(settings: Any, room: Room, alice: User) -> None:
    limits(settings, FILE_PART_CHARS=200)
    pages = [f"page {n} " + "word " * 60 for n in range(1, 4)]
    response = upload(client_of(alice), room, "spec.pdf", samples.pdf(pages))
    assert response.status_code == 201
    assert response.json()["pages"] == 3
    found = Attachment.objects.get(pk=response.json()["id"])
    assert response.json()["extract_ms"] == found.extract_ms
    assert [found.page_text(n).split()[:2] for n in (1, 2, 3)] == [["page", "1"], ["page", "2"], ["page", "3"]]
    parts = list(AttachmentPart.objects.filter(attachment=found))
    assert "".join(p.text for p in parts).split() == found.text.split()
    assert len(parts) > 3 and all(len(p.text) <= 200 for p in parts)
    assert [p.page for p in parts] == [1 + sum(s <= p.start for s in found.page_starts[1:]) for p in parts]
    assert {p.page for p in parts} == {1, 2, 3}
    assert all(p.room_id == room.pk for p in parts)


def test_parts_end_at_paragraphs_with_their_page() -> None:
    text = "\n\n".join(f"paragraph {i} " + "x" * 150 for i in range(20))
    starts = [0, text.index("paragraph 10")]
    found = extract.parts(text, starts, size=500)
    assert "".join(p.text for p in found) == text
    assert all(p.text.endswith("\n\n") for p in found[:-1])
    assert all(len(p.text) <= 500 for p in found)
    assert [p.page for p in found] == [1 if p.start < starts[1] else 2 for p in found]
    assert found[-1].page == 2 and [p.n for p in found] == list(range(len(found)))


def test_a_docx_and_text_files_are_read(room: Room, alice: User) -> None:
    client = client_of(alice)
    cases = [
        ("plan.docx", samples.docx(["The plan", "Step two"]), DOCX, "The plan\nStep two"),
        ("notes.md", "# Title\r\n\r\nbody é".encode(), "text/markdown", "# Title\n\nbody é"),
        ("template.md", b"<!-- keep -->\n# T\n", "text/markdown", "<!-- keep -->\n# T\n"),
        ("table.csv", b"\xef\xbb\xbfa,b\n1,2\n", "text/csv", "a,b\n1,2\n"),
        ("readme", b"plain words", "text/plain", "plain words"),
    ]
    for name, data, content_type, text in cases:
        response = upload(client, room, name, data)
        assert response.status_code == 201, (name, response.content)
        found = Attachment.objects.get(pk=response.json()["id"])
        assert (found.content_type, found.text) == (content_type, text)
    assert Attachment.objects.get(name="readme.txt").kind == "document"


def test_an_encrypted_pdf_is_refused_but_one_with_only_an_owner_password_is_read(room: Room, alice: User) -> None:
    client = client_of(alice)
    refused(upload(client, room, "locked.pdf", samples.encrypted_pdf("secret", "owner")), 422, "file.encrypted")
    response = upload(client, room, "restricted.pdf", samples.encrypted_pdf("", "owner"))
    assert response.status_code == 201
    assert Attachment.objects.get().text == "confidential plans"


def test_a_corrupt_pdf_is_refused_with_nothing_stored(room: Room, alice: User) -> None:
    before = stored_files()
    refused(upload(client_of(alice), room, "broken.pdf", samples.corrupt_pdf()), 422, "file.corrupt")
    assert not Attachment.objects.exists() and stored_files() == before


def test_a_zip_bomb_pdf_is_refused(room: Room, alice: User) -> None:
    bomb = samples.pdf_bomb(120)  # ~120 KB that inflate to 120 MB
    assert len(bomb) < 1 << 20
    refused(upload(client_of(alice), room, "bomb.pdf", bomb), 422, "file.too_complex")
    assert not Attachment.objects.exists()


def test_a_zip_bomb_docx_is_refused_unopened(settings: Any, room: Room, alice: User) -> None:
    limits(settings, MAX_FILE_BYTES=1 << 20)  # a DOCX may inflate to 10 MB
    bomb = samples.docx_bomb(12)
    assert len(bomb) < 1 << 20
    refused(upload(client_of(alice), room, "bomb.docx", bomb), 422, "file.too_complex")


def test_extraction_past_its_time_budget_is_stopped(settings: Any, room: Room, alice: User) -> None:
    limits(settings, EXTRACT_BUDGET_S=0.001)  # no child process even starts in a millisecond
    refused(upload(client_of(alice), room, "spec.pdf", samples.pdf(["x"])), 422, "file.too_complex")
    assert not Attachment.objects.exists()


def test_extraction_past_its_memory_is_stopped(settings: Any, room: Room, alice: User) -> None:
    # 70 MB inflated: under the reader's own limit (75 MB), over what 120 MB of address
    # space leaves the child once Python and pypdf are loaded (~55 MB).
    limits(settings, EXTRACT_MEMORY_MB=120)
    refused(upload(client_of(alice), room, "bomb.pdf", samples.pdf_bomb(70)), 422, "file.too_complex")
    assert not Attachment.objects.exists()


# --- limits ------------------------------------------------------------------------------


def test_a_file_past_the_cap_is_refused_before_it_is_parsed(settings: Any, room: Room, alice: User) -> None:
    limits(settings, MAX_FILE_BYTES=100_000)
    client = client_of(alice)
    before = stored_files()
    # Declared past the cap and its envelope: not parsed at all.
    refused(upload(client, room, "big.txt", b"a" * 300_000), 413, "file.too_large")
    # Within the envelope but past the cap: the parse stops at the cap.
    refused(upload(client, room, "big.txt", b"a" * 120_000), 413, "file.too_large")
    assert not Attachment.objects.exists() and stored_files() == before
    assert upload(client, room, "ok.txt", b"a" * 100_000).status_code == 201


def test_the_upload_rate_answers_429_with_retry_after(settings: Any, room: Room, alice: User, bob: User) -> None:
    limits(settings, UPLOAD_BURST=2, UPLOAD_REFILL_S=30.0)
    client = client_of(alice)
    assert [upload(client, room, "a.txt", b"a").status_code for _ in range(2)] == [201, 201]
    response = upload(client, room, "a.txt", b"a")
    refused(response, 429, "file.rate")
    assert response["Retry-After"] == "30"
    assert upload(client_of(bob), room, "b.txt", b"b").status_code == 201  # per member


def test_a_missing_file_field_is_a_400(room: Room, alice: User) -> None:
    refused(client_of(alice).post(f"/r/{room.slug}/files/", {"other": "x"}), 400, "file.missing")


def test_the_upload_needs_its_csrf_token(room: Room, alice: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert upload(client, room, "a.txt", b"a").status_code == 403
    client.get("/")  # the page sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    response = client.post(
        f"/r/{room.slug}/files/", {"file": SimpleUploadedFile("a.txt", b"a")}, headers={"X-CSRFToken": token}
    )
    assert response.status_code == 201


def test_only_post_and_only_signed_in(room: Room) -> None:
    assert Client().post(f"/r/{room.slug}/files/").status_code == 302  # to the login page
    refused_get = client_of(room.owner).get(f"/r/{room.slug}/files/")  # type: ignore[arg-type]
    assert refused_get.status_code == 405


def test_a_locked_or_archived_room_takes_no_upload(room: Room, alice: User) -> None:
    for status, code in [(Room.Status.LOCKED, "room.locked"), (Room.Status.ARCHIVED, "room.archived")]:
        Room.objects.filter(pk=room.pk).update(status=status)
        refused(upload(client_of(alice), room, "a.txt", b"a"), 403, code)
    assert not Attachment.objects.exists()


def test_a_failure_while_storing_leaves_no_row_and_no_bytes(
    monkeypatch: pytest.MonkeyPatch, room: Room, alice: User
) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(AttachmentPart.objects, "bulk_create", fail)
    before = stored_files()
    with pytest.raises(RuntimeError):
        uploads.intake(room, alice, SimpleUploadedFile("spec.pdf", samples.pdf(["a page"])))
    monkeypatch.setattr(Attachment, "save", fail)
    with pytest.raises(RuntimeError):
        uploads.intake(room, alice, SimpleUploadedFile("shot.png", samples.png_with_text()))
    assert not Attachment.objects.exists() and stored_files() == before


# --- who may fetch, and how ---------------------------------------------------------------


@pytest.fixture
def carol() -> User:
    return User.objects.create_user("carol", password="pw-carol-123")


def test_a_non_member_gets_404_everywhere(room: Room, alice: User, carol: User) -> None:
    response = upload(client_of(alice), room, "shot.png", samples.png_with_text())
    body = response.json()
    found = Attachment.objects.get(pk=body["id"])
    post_message(room, alice, found)
    stranger = client_of(carol)
    refused(upload(stranger, room, "a.txt", b"a"), 404, "room.forbidden")
    refused(upload(stranger, Room(slug="no-such-room"), "a.txt", b"a"), 404, "room.forbidden")
    for url in (body["url"], body["thumb_url"]):
        assert get(stranger, url).status_code == 404
    # The same id through a room of carol's own: still not hers.
    other = rooms.create_room(carol, "Elsewhere")
    assert get(stranger, f"/r/{other.slug}/f/{found.pk}/{found.name}").status_code == 404
    assert get(stranger, f"/r/{other.slug}/f/{found.pk}/thumb").status_code == 404
    # A member, but the wrong name: 404.
    assert get(client_of(alice), f"/r/{room.slug}/f/{found.pk}/other.png").status_code == 404


def test_an_upload_not_posted_is_its_uploader_s_alone(room: Room, alice: User, bob: User) -> None:
    body = upload(client_of(alice), room, "draft.png", samples.png_with_text()).json()
    assert get(client_of(alice), body["url"]).status_code == 200
    assert get(client_of(alice), body["thumb_url"]).status_code == 200
    assert get(client_of(bob), body["url"]).status_code == 404
    post_message(room, alice, Attachment.objects.get(pk=body["id"]))
    assert get(client_of(bob), body["url"]).status_code == 200


def test_staff_who_view_the_room_read_only_see_its_posted_files(room: Room, alice: User) -> None:
    staff = User.objects.create_user("dana", password="pw-dana-123", is_staff=True)
    posted = upload(client_of(alice), room, "shot.png", samples.png_with_text()).json()
    post_message(room, alice, Attachment.objects.get(pk=posted["id"]))
    draft = upload(client_of(alice), room, "draft.png", samples.png_with_text()).json()
    viewer = client_of(staff)
    assert get(viewer, posted["url"]).status_code == 200  # the page shows them its messages
    assert get(viewer, posted["thumb_url"]).status_code == 200
    assert get(viewer, draft["url"]).status_code == 404  # an upload not posted: alice's alone
    refused(upload(viewer, room, "a.txt", b"a"), 404, "room.forbidden")  # reading is not posting
    Ban.objects.create(room=room, user=staff, by=alice)
    assert get(viewer, posted["url"]).status_code == 404


def test_a_deleted_or_personal_message_s_file_is_not_served(
    django_capture_on_commit_callbacks: Any, room: Room, alice: User, bob: User
) -> None:
    client = client_of(alice)
    tomb = Attachment.objects.get(pk=upload(client, room, "a.txt", b"tombstone").json()["id"])
    post_message(room, alice, tomb, deleted_at=timezone.now())
    assert get(client, tomb.get_absolute_url()).status_code == 404
    private = Attachment.objects.get(pk=upload(client, room, "b.txt", b"private").json()["id"])
    post_message(room, alice, private, recipient=alice)
    assert get(client, private.get_absolute_url()).status_code == 200
    assert get(client_of(bob), private.get_absolute_url()).status_code == 404
    gone = Attachment.objects.get(pk=upload(client, room, "c.txt", b"gone").json()["id"])
    message = post_message(room, alice, gone)
    path = Path(gone.file.path)
    with django_capture_on_commit_callbacks(execute=True):
        message.delete()
    assert get(client, gone.get_absolute_url()).status_code == 404 and not path.exists()


def test_download_headers(room: Room, alice: User) -> None:
    client = client_of(alice)
    image = upload(client, room, "été photo.png", samples.png_with_text()).json()
    response = get(client, image["url"])
    found = Attachment.objects.get(pk=image["id"])
    with found.file.open("rb") as f:
        assert response.body == f.read()
    assert response["Content-Type"] == "image/png"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Content-Disposition"] == "inline; filename*=utf-8''%C3%A9t%C3%A9%20photo.png"
    assert (
        "sandbox" in response["Content-Security-Policy"] and "default-src 'none'" in response["Content-Security-Policy"]
    )
    assert "private" in response["Cache-Control"]
    thumb = get(client, image["thumb_url"])
    assert thumb["Content-Type"] == "image/webp" and thumb["Content-Disposition"].startswith("inline")

    page = upload(client, room, "index.md", b"<b>bold</b> text").json()
    response = get(client, page["url"])
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="index.md"'
    assert "sandbox" in response["Content-Security-Policy"]

    spec = upload(client, room, "spec.pdf", samples.pdf(["x"])).json()
    response = get(client, spec["url"])
    assert response["Content-Type"] == "application/pdf" and response["Content-Disposition"].startswith("inline")
    # Chromium's PDF viewer does not start in a sandboxed document: the PDF alone goes without.
    assert "sandbox" not in response["Content-Security-Policy"]
    assert response["X-Content-Type-Options"] == "nosniff"

    plan = upload(client, room, "plan.docx", samples.docx(["x"])).json()
    response = get(client, plan["url"])
    assert response["Content-Type"] == DOCX and response["Content-Disposition"].startswith("attachment")


def test_behind_nginx_the_bytes_go_by_x_accel_redirect(settings: Any, room: Room, alice: User) -> None:
    settings.COLLAB_FILES_ACCEL = "/protected-files/"
    client = client_of(alice)
    body = upload(client, room, "a.png", samples.png_with_text()).json()
    found = Attachment.objects.get(pk=body["id"])
    response = get(client, body["url"])
    assert response["X-Accel-Redirect"] == f"/protected-files/{found.file.name}"
    assert response.body == b"" and response["Content-Type"] == "image/png"
    assert response["Content-Disposition"].startswith("inline")
    assert client_of(User.objects.create_user("dave")).get(body["url"]).status_code == 404


# --- clean-up ------------------------------------------------------------------------------


def test_the_sweep_deletes_old_uploads_never_posted(
    django_capture_on_commit_callbacks: Any, room: Room, alice: User
) -> None:
    client = client_of(alice)
    ids = [upload(client, room, f"{n}.png", samples.png_with_text()).json()["id"] for n in range(3)]
    old, fresh, posted = Attachment.objects.in_bulk(ids).values()
    post_message(room, alice, posted)
    Attachment.objects.filter(pk__in=[old.pk, posted.pk]).update(created_at=timezone.now() - timedelta(hours=25))
    old_paths = [Path(old.file.path), Path(old.thumb.path)]
    with django_capture_on_commit_callbacks(execute=True):
        call_command("sweep_uploads", stdout=io.StringIO())
    assert set(Attachment.objects.values_list("pk", flat=True)) == {fresh.pk, posted.pk}
    assert not any(p.exists() for p in old_paths)
    assert Path(fresh.file.path).exists() and Path(posted.file.path).exists()


def test_deleting_a_room_deletes_its_files(django_capture_on_commit_callbacks: Any, room: Room, alice: User) -> None:
    client = client_of(alice)
    upload(client, room, "a.png", samples.png_with_text())
    upload(client, room, "b.pdf", samples.pdf(["x"]))
    other = rooms.create_room(alice, "Kept")
    kept = Attachment.objects.get(pk=upload(client, other, "c.txt", b"kept").json()["id"])
    paths = [
        Path(p)
        for a in Attachment.objects.filter(room=room)
        for p in (a.file.path, a.thumb.path if a.thumb else "")
        if p
    ]
    assert len(paths) == 3 and all(p.exists() for p in paths)
    with django_capture_on_commit_callbacks(execute=True):
        room.delete()
    assert not any(p.exists() for p in paths)
    assert not AttachmentPart.objects.filter(room_id=room.pk).exists()
    assert Path(kept.file.path).exists()


def test_an_attachment_made_directly_is_served(room: Room, alice: User) -> None:
    """The contract's shortcut for other tests (HELPERS.md) works with these views."""
    data = samples.png_with_text()
    found = Attachment.objects.create(
        room=room, uploader=alice, uploader_name="alice", name="a.png", kind="image", content_type="image/png",
        size=len(data), file=ContentFile(data, "a.png"), width=300, height=200,
    )  # fmt: skip
    response = get(client_of(alice), found.get_absolute_url())
    assert response.status_code == 200 and response["Content-Type"] == "image/png"


def test_serve_schedules_the_sweep(settings: Any) -> None:
    from collab.chat.management.commands import serve

    started: list[list[str]] = []

    class Children:
        def start(self, command: list[str], name: str, stage: int, **kw: Any) -> None:
            started.append(command)

    settings.COLLAB_SWEEP_UPLOADS_S = 3600.0
    serve.Command().schedule_upload_sweep(Children())  # type: ignore[arg-type]
    assert started and started[0][1:] == ["manage.py", "sweep_uploads", "--every", "3600"]
    settings.COLLAB_SWEEP_UPLOADS_S = 0.0
    serve.Command().schedule_upload_sweep(Children())  # type: ignore[arg-type]
    assert len(started) == 1


@pytest.mark.redis
def test_the_upload_rate_is_shared_through_redis(settings: Any, room: Room, alice: User) -> None:
    from tests.conftest import _use_layer

    _use_layer(settings, "redis")
    limits(settings, UPLOAD_BURST=1, UPLOAD_REFILL_S=60.0)
    assert upload(client_of(alice), room, "a.txt", b"a").status_code == 201
    refused(upload(client_of(alice), room, "a.txt", b"a"), 429, "file.rate")


def test_documents_wait_for_a_free_child_then_give_up(
    settings: Any, monkeypatch: pytest.MonkeyPatch, room: Room, alice: User
) -> None:
    import threading

    busy = threading.BoundedSemaphore(1)
    busy.acquire()  # every child taken
    monkeypatch.setattr(extract, "CHILDREN", busy)
    limits(settings, EXTRACT_BUDGET_S=0.05)
    refused(upload(client_of(alice), room, "spec.pdf", samples.pdf(["x"])), 503, "server.unavailable")
    assert upload(client_of(alice), room, "notes.txt", b"text needs no child").status_code == 201
    busy.release()
    limits(settings, EXTRACT_BUDGET_S=20.0)
    assert upload(client_of(alice), room, "spec.pdf", samples.pdf(["x"])).status_code == 201
