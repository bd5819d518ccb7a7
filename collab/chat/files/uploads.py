"""An upload taken in (docs/architecture/files.md, "Intake"): checked, made safe, stored
whole or not at all.

`intake` reads the member's file (at most COLLAB["MAX_FILE_BYTES"]), sniffs its type
from the content, re-encodes an image or extracts a document's text, and only then
stores the bytes and writes the Attachment and its parts in one transaction. Should any
step fail, nothing is left: no row, and the bytes already written to the storage are
deleted again. The caller (collab/chat/file_views.py) has checked the member, the room
and the upload rate; this runs on the request's thread, never on the event loop.
"""

from __future__ import annotations

import re
import unicodedata

from django.conf import settings
from django.contrib.auth.models import User
from django.core.files.base import ContentFile
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction

from collab.chat.file_models import Attachment, AttachmentPart
from collab.chat.files import extract, images
from collab.chat.files.errors import FileRefused
from collab.chat.files.sniff import sniff
from collab.chat.models import Room

MAX_NAME = 200
# Bidirectional overrides and isolates: "invoice_\u202efdp.exe" must not read as "invoice_exe.pdf".
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")


def too_large() -> FileRefused:
    limit = int(settings.COLLAB["MAX_FILE_BYTES"])
    return FileRefused("file.too_large", f"This file is larger than {limit / (1 << 20):g} MB, the limit.")


def safe_name(raw: str, extension: str) -> str:
    """The name a member gave, made safe to show and to put in a header: no folders, no
    control or bidi-override characters, at most MAX_NAME characters, ending in the
    extension of the type the content has (a PDF sent as "x.png" is named "x.pdf")."""
    name = unicodedata.normalize("NFC", raw).replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C")  # controls, format chars
    name = _BIDI.sub("", name)
    name = re.sub(r"\s+", " ", name).strip().strip(".")
    stem = name.rsplit(".", 1)[0] if "." in name else name
    stem = stem.strip() or "file"
    suffix = f".{extension}"
    return stem[: MAX_NAME - len(suffix)].rstrip(" .") + suffix


def _read(uploaded: UploadedFile) -> bytes:
    limit = int(settings.COLLAB["MAX_FILE_BYTES"])
    if uploaded.size is not None and uploaded.size > limit:
        raise too_large()
    uploaded.seek(0)
    data = uploaded.read(limit + 1)
    if len(data) > limit:
        raise too_large()
    return bytes(data)


def intake(room: Room, user: User, uploaded: UploadedFile) -> Attachment:
    """The upload stored as an Attachment of `room` by `user`, not yet posted; raises
    FileRefused (file.too_large, file.type_refused, file.corrupt, file.encrypted,
    file.too_complex) with nothing stored."""
    data = _read(uploaded)
    if not data:
        raise FileRefused("file.corrupt", "This file is empty.")
    kind = sniff(data, uploaded.name or "")
    attachment = Attachment(
        room=room,
        uploader=user,
        uploader_name=user.get_username(),
        name=safe_name(uploaded.name or "", kind.extension),
        kind=kind.kind,
        content_type=kind.content_type,
    )
    thumb: bytes | None = None
    found: list[extract.Part] = []
    if kind.kind == Attachment.Kind.IMAGE:
        image = images.process(data, kind.content_type)
        data, thumb = image.data, image.thumb
        attachment.width, attachment.height = image.width, image.height
    else:
        text = extract.extract(data, kind.content_type)
        attachment.text, attachment.page_starts, attachment.extract_ms = text.text, text.page_starts, text.extract_ms
        found = extract.parts(text.text, text.page_starts)
    attachment.size = len(data)
    return _store(attachment, data, thumb, found)


def _store(attachment: Attachment, data: bytes, thumb: bytes | None, found: list[extract.Part]) -> Attachment:
    storage = attachment.file.storage
    written: list[str] = []
    try:
        # The bytes first (the names are random: nobody can reach them before the row exists),
        # then the rows in one transaction; a failure anywhere deletes what was written.
        attachment.file.save("upload", ContentFile(data), save=False)
        written.append(attachment.file.name)
        if thumb is not None:
            attachment.thumb.save("thumb", ContentFile(thumb), save=False)
            written.append(attachment.thumb.name)
        with transaction.atomic():
            attachment.save()
            AttachmentPart.objects.bulk_create(
                AttachmentPart(
                    attachment=attachment, room_id=attachment.room_id, n=p.n, page=p.page, start=p.start, text=p.text
                )
                for p in found
            )
    except BaseException:
        for name in written:
            storage.delete(name)
        raise
    return attachment
