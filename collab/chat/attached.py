"""A message's files as its article shows them (templates/chat/_attachments.html), without
a query where it renders (docs/architecture/files.md).

Files are only ever a person's message's (an assistant's reply has none). Rendering asks
`of(message)`, which reads what the list's query prefetched (`with_files`: one query for
the whole list) or what the post left on its message (`remember`: the post path renders
its "new" frame on the event loop, where no query may run). Below the services
(pyproject's layers): rendering.py uses it; services/attachments.py writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from django.db.models import Prefetch, QuerySet

from collab.chat.file_models import Attachment
from collab.chat.models import Message

Rows = TypeVar("Rows", bound=QuerySet[Message])
CACHE = "attachments"  # Message.attachments' related name: Django's prefetch cache key

# What an article shows of a file: never its extracted text (up to MAX_EXTRACTED_CHARS);
# its room, for its URLs.
SHOWN = Attachment.objects.select_related("room").defer("text", "page_starts").order_by("position", "id")
PREFETCH = Prefetch(CACHE, queryset=SHOWN)


def with_files(rows: Rows) -> Rows:
    """`rows` with their files loaded in one more query for the whole list."""
    return rows.prefetch_related(PREFETCH)


_NONE: tuple[Attachment, ...] = ()


def remember(message: Message, files: Iterable[Attachment]) -> None:
    """Leave `files` on `message` as its prefetched attachments: rendering it needs no
    query (the post path renders its "new" frame on the event loop). No files (most
    posts): one shared empty tuple, not a QuerySet of its own, which every message the
    process keeps would carry (2.5 KB each: tests/test_outage.py's 1,500 posts, 3.7 MB
    of the 4 MB it allows)."""
    files = list(files)
    rows: object = _NONE
    if files:
        rows = message.attachments.all()  # lazy: no query
        rows._result_cache = files  # type: ignore[attr-defined]
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
