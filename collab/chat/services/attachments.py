"""Files on messages (docs/wire.md, "post" and "Files"; docs/architecture/files.md):
the `files` of a post, checked and attached in the transaction that stores it; a
message's files as its article shows them, loaded with the list that renders it; and
their removal with a member's deletion of the message.

An upload is an `Attachment` with no message (the upload view stores it). A post names
uploads by id: each must be the poster's, in this room, and not posted yet; anything else
(another member's, another room's, already posted, unknown) is the same `file.not_found`,
so an id reveals nothing. Two posts racing for one upload: its row is locked as it is
read (`select_for_update`, PostgreSQL) and taken by an UPDATE that holds only while it has
no message (`message IS NULL`): the second post finds it taken and is refused whole.

A message's files are only ever a person's message's (an assistant's reply has none):
rendering asks `of(message)`, which reads what the list's query prefetched (`PREFETCH`)
or what the post left on the message (`remember`), so a render on the event loop never
queries, and a list renders without one query per message.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from django.conf import settings
from django.db.models import Case, IntegerField, Prefetch, Q, QuerySet, Value, When

from collab.chat.errors import ClientError
from collab.chat.file_models import Attachment
from collab.chat.models import Message

Rows = TypeVar("Rows", bound=QuerySet[Message])
CACHE = "attachments"  # Message.attachments' related name: Django's prefetch cache key

# What an article shows of a file: never its extracted text (up to MAX_EXTRACTED_CHARS).
SHOWN = Attachment.objects.select_related("room").defer("text", "page_starts").order_by("position", "id")
PREFETCH = Prefetch(CACHE, queryset=SHOWN)


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
        remember(message, [])
        return []
    position = Case(*(When(pk=a.pk, then=Value(i)) for i, a in enumerate(files)), output_field=IntegerField())
    taken = Attachment.objects.filter(pk__in=[a.pk for a in files], message__isnull=True)
    if taken.update(message=message, position=position) != len(files):
        raise not_found()
    for i, a in enumerate(files):
        a.message, a.position = message, i
        a.room = message.room  # for its URLs: the post's room, already read
    remember(message, files)
    return list(files)


def remember(message: Message, files: Iterable[Attachment]) -> None:
    """Leave `files` on `message` as its prefetched attachments: rendering it needs no
    query (the post path renders its "new" frame on the event loop)."""
    rows = message.attachments.all()  # lazy: no query
    rows._result_cache = list(files)  # type: ignore[attr-defined]
    rows._prefetch_done = True  # type: ignore[attr-defined]
    cache = getattr(message, "_prefetched_objects_cache", None)
    if cache is None:
        message._prefetched_objects_cache = cache = {}  # type: ignore[attr-defined]
    cache[CACHE] = rows


def of(message: Message) -> list[Attachment]:
    """The files an article shows: none for a reply or a deleted message; else those its
    list prefetched (PREFETCH) or its post left (remember). A person's message loaded
    without them is read here (one query: a page of one, on the database thread)."""
    if message.role != Message.Role.USER or message.deleted_at is not None or message.pk is None:
        return []
    cached = getattr(message, "_prefetched_objects_cache", {}).get(CACHE)
    if cached is not None:
        return list(cached)
    return list(SHOWN.filter(message=message))


def with_files(rows: Rows) -> Rows:
    """`rows` with their files loaded in one more query for the whole list."""
    return rows.prefetch_related(PREFETCH)


def drop(message: Message) -> int:
    """Delete a message's files (a member deleting it), in the caller's transaction; their
    bytes follow on commit (file_models: the post_delete receiver)."""
    count, _ = Attachment.objects.filter(message=message).delete()
    remember(message, [])
    return count


def visible(room_id: int, user_id: int) -> QuerySet[Attachment]:
    """The files of a room a member may fetch: those of messages they see (visible_to:
    never a file of another member's personal message, should one ever hold one), and
    their own uploads not posted yet."""
    seen = Message.objects.visible_to(user_id).filter(room_id=room_id, deleted_at__isnull=True)
    return Attachment.objects.filter(room_id=room_id).filter(
        Q(message__in=seen.values("pk")) | Q(message__isnull=True, uploader_id=user_id)
    )
