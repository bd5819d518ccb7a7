"""An agent's file tools (tools.py offers them; docs/architecture/agents.md):
`read_file` (a posted file's text, by page or range; an image's description) and
`search_files` (the parts of this room's documents that match a query).

Authorised as `read_message` is: the run's reader must still be a member, and a file
exists for it only when it was posted with a message the reader may see
(`Message.objects.visible_to`: a shared one, or a personal reply made for them). A file
of another room, not posted yet, of a deleted message or of someone else's personal
message is "not found", the same answer as a file that does not exist. Sync: called
through database_sync_to_async.
"""

from __future__ import annotations

from django.db.models import Q, QuerySet

from collab.chat.file_models import Attachment, AttachmentPart
from collab.chat.files import ranking
from collab.chat.files.for_models import human_size
from collab.chat.models import Room
from collab.chat.replies.tool_spec import ToolError

READ_CHARS = 3500  # of text per call (the toolbox caps a result at 4000 characters)
SEARCH_RESULTS = 10
SNIPPET_CHARS = 240
MAX_ID = 2**53


def visible(here: Room, reader_id: int | None, prefix: str = "") -> Q:
    """The files (`prefix`: the path to the attachment) the reader may see in `here`."""
    message = f"{prefix}message__"
    return Q(
        **{f"{prefix}room": here, f"{message}isnull": False, f"{message}deleted_at__isnull": True},
    ) & (Q(**{f"{message}recipient__isnull": True}) | Q(**{f"{message}recipient_id": reader_id or 0}))


def _described(attachment: Attachment) -> str:
    pixels = f", {attachment.width}x{attachment.height}" if attachment.width and attachment.height else ""
    pages = "" if attachment.is_image else f", {attachment.pages} page{'s' if attachment.pages != 1 else ''}"
    return f"{attachment.name} ({attachment.content_type}, {human_size(attachment.size)}{pixels}{pages})"


def read_file(
    here: Room, reader_id: int | None, file_id: int, page: int | None, start: int | None, end: int | None
) -> str:
    found = Attachment.objects.filter(visible(here, reader_id), pk=file_id) if 0 < file_id < MAX_ID else None
    attachment = found.first() if found is not None else None
    if attachment is None:
        return f"no file {file_id}"
    head = f"file {attachment.pk}: {_described(attachment)}"
    if attachment.is_image:
        return f"{head}: an image; it has no text to read."
    text = attachment.text
    if not text:
        return f"{head}: no text could be read from it."
    page_begin = 0
    if page is not None:  # `start` and `end` then count from the page's beginning
        if not 1 <= page <= attachment.pages:
            raise ToolError(f"read_file: file {file_id} has pages 1 to {attachment.pages}")
        starts = list(attachment.page_starts) or [0]
        page_begin = starts[page - 1]
        page_end = starts[page] if page < len(starts) else len(text)
        begin = page_begin + max(0, start or 0)
        limit = min(page_end, page_begin + end if end is not None else page_end)
        head += f", page {page} of {attachment.pages}"
    else:
        begin = max(0, start or 0)
        limit = min(len(text), end if end is not None else len(text))
    stop = min(limit, begin + READ_CHARS)
    if stop <= begin:
        raise ToolError(f"read_file: nothing there (file {file_id} has {len(text):,} characters)")
    more = f"\n… (more: call again with start={stop - page_begin})" if stop < limit else ""
    return f"{head}, characters {begin:,} to {stop:,} of {len(text):,}:\n{text[begin:stop]}{more}"


def _snippet(text: str, words: list[str]) -> str:
    lower = text.lower()
    at = min((i for i in (lower.find(w) for w in words) if i >= 0), default=0)
    begin = max(0, at - SNIPPET_CHARS // 3)
    piece = " ".join(text[begin : begin + SNIPPET_CHARS].split())
    return ("…" if begin else "") + piece + ("…" if begin + SNIPPET_CHARS < len(text) else "")


def search_files(here: Room, reader_id: int | None, query: str) -> str:
    words = ranking.words(query)
    if not words:
        raise ToolError("search_files: give words to look for (three letters or more)")
    named = Q()
    for word in words:
        named |= Q(name__icontains=word)
    by_name = list(Attachment.objects.filter(visible(here, reader_id)).filter(named).order_by("-id")[:SEARCH_RESULTS])
    parts: QuerySet[AttachmentPart] = AttachmentPart.objects.filter(visible(here, reader_id, "attachment__"))
    found = ranking.rank_parts(parts, query, SEARCH_RESULTS)
    lines = [f"file {a.pk} {_described(a)}: its name matches" for a in by_name]
    for part in found:
        attachment = part.attachment
        lines.append(f"file {attachment.pk} {attachment.name}, page {part.page}: {_snippet(part.text, words)}")
    if not lines:
        return f"no file in {here.slug} matches {query[:100]!r}"
    return "\n".join(lines[:SEARCH_RESULTS])
