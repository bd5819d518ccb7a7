"""Files in a room (docs/wire.md, "Files"): what a member uploads, and the message it is
posted with. Part of collab.chat's models (re-exported by models.py).

An upload is stored at once, with no message (`message` None): the post that names its
id attaches it (commands/posting.py). One never posted is removed after
COLLAB["ORPHAN_UPLOAD_HOURS"] (management command `sweep_uploads`). A document's text is
extracted once, at upload, and kept here and in its parts (`AttachmentPart`), which the
model's context, `search_files` and the room's search rank.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.urls import reverse


def _stored_name(instance: Attachment, filename: str) -> str:
    # Never the member's file name on disk or in the bucket: a random one, by room.
    return f"files/{instance.room_id}/{uuid.uuid4().hex}"


def _thumb_name(instance: Attachment, filename: str) -> str:
    return f"files/{instance.room_id}/{uuid.uuid4().hex}-thumb"


class Attachment(models.Model):
    class Kind(models.TextChoices):
        IMAGE = "image", "image"
        DOCUMENT = "document", "document"

    room = models.ForeignKey("chat.Room", on_delete=models.CASCADE, related_name="attachments")
    # Who uploaded it: only they may post it. Kept as written after a rename, like author_name.
    uploader = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="attachments"
    )
    uploader_name = models.CharField(max_length=150)
    # None until posted; the message's deletion (a row, or a member's tombstone) takes it.
    message = models.ForeignKey(
        "chat.Message", null=True, blank=True, on_delete=models.CASCADE, related_name="attachments"
    )
    position = models.PositiveSmallIntegerField(default=0)  # its place among the message's files
    name = models.CharField(max_length=200)  # as the member named it, made safe (services/uploads.py)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    content_type = models.CharField(max_length=100)  # sniffed from the content, never the extension's
    size = models.PositiveBigIntegerField()  # bytes as stored (an image: re-encoded)
    file = models.FileField(upload_to=_stored_name, max_length=200)
    thumb = models.FileField(upload_to=_thumb_name, max_length=200, blank=True)
    width = models.PositiveIntegerField(null=True, blank=True)  # images: as stored
    height = models.PositiveIntegerField(null=True, blank=True)
    # A document's text, extracted at upload ("" for an image, or a document without text).
    text = models.TextField(blank=True)
    # Where each page starts in `text` (a PDF's pages; one page for other documents).
    page_starts = models.JSONField(default=list, blank=True)
    extract_ms = models.PositiveIntegerField(default=0)  # how long the extraction took
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["message", "position"], name="attachment_message"),
            models.Index(fields=["room", "created_at"], name="attachment_room_created"),
        ]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("file", args=[self.room.slug, self.pk, self.name])

    @property
    def is_image(self) -> bool:
        return self.kind == self.Kind.IMAGE

    @property
    def pages(self) -> int:
        return max(1, len(self.page_starts))

    def page_text(self, page: int) -> str:
        """Page `page` (from 1) of the document's text; "" past its end."""
        starts = list(self.page_starts) or [0]
        if page < 1 or page > len(starts):
            return ""
        end = starts[page] if page < len(starts) else len(self.text)
        return self.text[starts[page - 1] : end]

    def thumb_url(self) -> str:
        return reverse("file_thumb", args=[self.room.slug, self.pk])


class AttachmentPart(models.Model):
    """A stretch of a document's text (about COLLAB["FILE_PART_CHARS"]), ranked against a
    question when the whole does not fit a model's context (chat/files/for_models.py)."""

    attachment = models.ForeignKey(Attachment, on_delete=models.CASCADE, related_name="parts")
    room = models.ForeignKey("chat.Room", on_delete=models.CASCADE, related_name="+")
    n = models.PositiveIntegerField()  # its order in the document, from 0
    page = models.PositiveIntegerField(default=1)  # the page it starts on
    start = models.PositiveIntegerField()  # where in Attachment.text
    text = models.TextField()

    class Meta:
        ordering = ["attachment", "n"]
        constraints = [models.UniqueConstraint(fields=["attachment", "n"], name="one_part_per_number")]

    def __str__(self) -> str:
        return f"{self.attachment_id}#{self.n}"


@receiver(post_delete, sender=Attachment)
def _remove_stored(sender: Any, instance: Attachment, **kwargs: Any) -> None:
    # The row is gone (a message's, a room's or a sweep's deletion cascades here): its bytes
    # follow once the deletion commits, never before (a rolled-back delete keeps them).
    names = [f.name for f in (instance.file, instance.thumb) if f and f.name]
    if names:
        storage = instance.file.storage

        def remove() -> None:
            for name in names:
                storage.delete(name)

        transaction.on_commit(remove)
