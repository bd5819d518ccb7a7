"""Files on messages (docs/wire.md, "post" and "Files"; docs/architecture/files.md):
the `files` of a post, checked and attached in the transaction that stores it; their
removal with a member's deletion of the message; which files a member may fetch.

An upload is an `Attachment` with no message (the upload view stores it). A post names
uploads by id: each must be the poster's, in this room, and not posted yet; anything else
(another member's, another room's, already posted, unknown) is the same `file.not_found`,
so an id reveals nothing. Two posts racing for one upload: its row is locked as it is
read (`select_for_update`, PostgreSQL) and taken by an UPDATE that holds only while it has
no message (`message IS NULL`): the second post finds it taken and is refused whole.

How an article finds a message's files without a query: chat/attached.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.db.models import Case, IntegerField, Q, QuerySet, Value, When

from collab.chat import attached
from collab.chat.errors import ClientError
from collab.chat.file_models import Attachment
from collab.chat.models import Message


def not_found() -> ClientError:
    return ClientError(
        "file.not_found", "One of those files is not an upload of yours in this room, or was posted already."
    )


def check_files(value: object) -> list[int]:
    """The `files` of a post: a list of distinct upload ids (ints), at most
    MAX_MESSAGE_FILES; [] when absent. Checked before any I/O."""
    if value is None:
        return []
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
        raise ClientError("file.invalid", "files must be a list of upload ids.")
    if len(set(value)) != len(value):
        raise ClientError("file.invalid", "files names the same upload twice.")
    cap = settings.COLLAB["MAX_MESSAGE_FILES"]
    if len(value) > cap:
        raise ClientError("file.too_many", f"A message carries at most {cap} files; this one has {len(value)}.")
    return list(value)


def claim(room_id: int, user_id: int, ids: Sequence[int]) -> list[Attachment]:
    """The uploads `ids` of member `user_id` in room `room_id`, not posted yet, locked, in
    the order named; a ClientError when any is not that, or they are over the message's
    total. Called inside the transaction that stores the post."""
    if not ids:
        return []
    rows = Attachment.objects.select_for_update().filter(
        pk__in=ids, room_id=room_id, uploader_id=user_id, message__isnull=True
    )
    found = {a.pk: a for a in rows.defer("text", "page_starts")}
    if len(found) != len(ids):
        raise not_found()
    cap = settings.COLLAB["MAX_MESSAGE_FILE_BYTES"]
    total = sum(a.size for a in found.values())
    if total > cap:
        raise ClientError(
            "file.too_large", f"A message's files are at most {cap:,} bytes together; these are {total:,}."
        )
    return [found[i] for i in ids]


def attach(message: Message, files: Sequence[Attachment]) -> list[Attachment]:
    """Give `files` (claimed) to `message`, in their order, in the caller's transaction;
    a ClientError if another post took one meanwhile (never on PostgreSQL, where `claim`
    locked them; the condition keeps it true on any database)."""
    if not files:
        attached.remember(message, [])
        return []
    position = Case(*(When(pk=a.pk, then=Value(i)) for i, a in enumerate(files)), output_field=IntegerField())
    taken = Attachment.objects.filter(pk__in=[a.pk for a in files], message__isnull=True)
    if taken.update(message=message, position=position) != len(files):
        raise not_found()
    for i, a in enumerate(files):
        a.message, a.position = message, i
        a.room = message.room  # for its URLs: the post's room, already read
    attached.remember(message, files)
    return list(files)


def drop(message: Message) -> int:
    """Delete a message's files (a member deleting it), in the caller's transaction; their
    bytes follow on commit (file_models: the post_delete receiver)."""
    count, _ = Attachment.objects.filter(message=message).delete()
    attached.remember(message, [])
    return count


def visible(room_id: int, user_id: int) -> QuerySet[Attachment]:
    """The files of a room a member may fetch: those of messages they see (visible_to:
    never a file of another member's personal message, should one ever hold one), and
    their own uploads not posted yet."""
    seen = Message.objects.visible_to(user_id).filter(room_id=room_id, deleted_at__isnull=True)
    return Attachment.objects.filter(room_id=room_id).filter(
        Q(message__in=seen.values("pk")) | Q(message__isnull=True, uploader_id=user_id)
    )
