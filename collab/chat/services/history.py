"""A room's history for one member: search it, read it around one message, take it away
(docs/wire.md, "HTTP"). Every read goes through `Message.objects.visible_to(user_id)`:
the shared messages and that member's own personal replies, never anyone else's.

Search is PostgreSQL full-text search (websearch syntax, ranked by the database, shown
newest first, with highlighted excerpts from ts_headline) on PostgreSQL, and a
case-insensitive match of every word on SQLite. Deleted messages are never found. A
message is also found by its files (services/attachments.py): a file's name holding every
word, or its extracted text matching (PostgreSQL: any of its parts, AttachmentPart;
SQLite: every word in its text); the excerpt is then the file's.

The export is the admin's transcript format (actions.transcripts: `record_of`,
`markdown_message`), one member's view of one room, streamed row by row; a message's
files as links to the file view (absolute URLs), and in JSON as a `files` list.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import cast

from asgiref.sync import sync_to_async
from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

from collab.chat import attached
from collab.chat.errors import ClientError
from collab.chat.file_models import Attachment, AttachmentPart
from collab.chat.models import Message, Room, room_order
from collab.chat.services import transcripts

MAX_QUERY_CHARS = 200
MAX_TERMS = 12
PAGE_SIZE = 20
CONTEXT_AROUND = 10  # messages before and after the one a search result opens
EXCERPT_CHARS = 240
# ts_headline's marks: characters a stored message cannot hold (posting refuses NUL, but
# these two are plain controls; escaping happens after, so a text holding them only ever
# yields <mark> elements).
_START, _STOP = "\x02", "\x03"
FIELDS: tuple[str, ...] = (*transcripts.FIELDS, "edited_at", "deleted_at")


def check_query(raw: object) -> str:
    """The query, stripped; a ClientError when it is empty or too long."""
    q = raw.strip() if isinstance(raw, str) else ""
    if not q:
        raise ClientError("search.empty", "Type a word or two to search this room.")
    if len(q) > MAX_QUERY_CHARS or "\x00" in q:
        raise ClientError(
            "search.too_long", f"A search is at most {MAX_QUERY_CHARS} characters; this one has {len(q):,}."
        )
    return q


def _terms(q: str) -> list[str]:
    words = [w.strip("\"'()").lstrip("-") for w in q.split()]
    return [w for w in words if w and w.lower() != "or"][:MAX_TERMS]


def searchable(room: Room, user_id: int) -> QuerySet[Message]:
    """What a member's search may find: visible to them, not deleted, with text or files;
    of a reply's versions, the one the room shows (its page holds no other)."""
    seen = Message.objects.visible_to(user_id).filter(room=room, deleted_at__isnull=True, version_hidden=False)
    return seen.filter(~Q(text="") | Exists(Attachment.objects.filter(message=OuterRef("pk"))))


def _named(terms: list[str]) -> Exists:
    """A message with a file whose name holds every term."""
    files = Attachment.objects.filter(message=OuterRef("pk"))
    for term in terms:
        files = files.filter(name__icontains=term)
    return Exists(files)


def search(room: Room, user_id: int, q: str) -> QuerySet[Message]:
    """The matches, newest first, their files loaded (services/attachments.py); on
    PostgreSQL each carries `headline` (ts_headline)."""
    found = attached.with_files(searchable(room, user_id))
    terms = _terms(q)
    if connection.vendor == "postgresql":
        from django.contrib.postgres.search import SearchHeadline, SearchQuery, SearchVector

        query = SearchQuery(q, search_type="websearch", config="english")
        parts = AttachmentPart.objects.filter(attachment__message=OuterRef("pk"))
        in_files = Exists(parts.alias(v=SearchVector("text", config="english")).filter(v=query))
        by_file = in_files | _named(terms) if terms else in_files
        return (
            found.alias(match=SearchVector("text", config="english"))
            .filter(Q(match=query) | by_file)
            .annotate(
                headline=SearchHeadline(
                    "text",
                    query,
                    config="english",
                    start_sel=_START,
                    stop_sel=_STOP,
                    max_words=40,
                    min_words=15,
                    max_fragments=2,
                    fragment_delimiter=" … ",
                )
            )
            .order_by("-seq")
        )
    if not terms:
        return found.none()
    match, in_text = Q(), Attachment.objects.filter(message=OuterRef("pk"))
    for term in terms:
        match &= Q(text__icontains=term)
        in_text = in_text.filter(text__icontains=term)
    return found.filter(match | _named(terms) | Exists(in_text)).order_by("-seq")


def _marked(text: str) -> SafeString:
    """ts_headline's text: escaped, its marks as <mark> elements."""
    return mark_safe(html.escape(text).replace(_START, "<mark>").replace(_STOP, "</mark>"))  # escaped first


def _excerpt_of(text: str, terms: Iterable[str]) -> SafeString:
    """An excerpt around the first match of any term, escaped, each match in <mark>."""
    pattern = "|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True) if t)
    found = re.search(pattern, text, re.IGNORECASE) if pattern else None
    start = max(0, found.start() - EXCERPT_CHARS // 3) if found else 0
    piece = text[start : start + EXCERPT_CHARS]
    parts, at = [], 0
    if pattern:
        for m in re.finditer(pattern, piece, re.IGNORECASE):
            parts += [html.escape(piece[at : m.start()]), "<mark>", html.escape(m.group()), "</mark>"]
            at = m.end()
    parts.append(html.escape(piece[at:]))
    lead = "… " if start else ""
    tail = " …" if start + EXCERPT_CHARS < len(text) else ""
    return mark_safe(lead + "".join(parts) + tail)  # every piece escaped


def _holds(text: str, terms: Iterable[str]) -> bool:
    low = text.lower()
    return any(t.lower() in low for t in terms if t)


def excerpt(message: Message, q: str) -> SafeString:
    """Where the message matched: its text (ts_headline's, or around the first word), else
    the file that matched: its name, and the first part of its text holding a word."""
    headline = getattr(message, "headline", None)
    terms = _terms(q)
    if headline and _START in headline:
        return _marked(headline)
    if _holds(message.text, terms) or not terms:
        return _marked(headline) if headline else _excerpt_of(message.text, terms)
    for f in attached.of(message):
        part = None
        for term in terms:  # one query per word at most, for a result found by a file's text
            part = AttachmentPart.objects.filter(attachment=f, text__icontains=term).order_by("n").first()
            if part is not None:
                break
        if part is not None or _holds(f.name, terms):
            shown = _excerpt_of(part.text, terms) if part is not None else ""
            return mark_safe(f"{_excerpt_of(f.name, terms)}{': ' if shown else ''}{shown}")  # each escaped
    return _marked(headline) if headline else _excerpt_of(message.text, terms)


def around(room: Room, user_id: int, seq: int) -> tuple[list[Message], bool, bool]:
    """The messages a member sees around `seq` (oldest first), and whether there are
    older and newer ones beyond them (of a reply's versions, the one shown, in its slot's place)."""
    seen = Message.objects.visible_to(user_id).filter(room=room, version_hidden=False, thread__isnull=True)
    seen = attached.with_files(seen.select_related("reply_to", "recipient"))
    before = list(seen.filter(seq__lte=seq).order_by("-seq")[: CONTEXT_AROUND + 2])
    after = list(seen.filter(seq__gt=seq).order_by("seq")[: CONTEXT_AROUND + 1])
    shown = before[: CONTEXT_AROUND + 1][::-1] + after[:CONTEXT_AROUND]
    return (
        sorted(shown, key=room_order),
        len(before) > CONTEXT_AROUND + 1,
        len(after) > CONTEXT_AROUND,
    )


# --- export ------------------------------------------------------------------------------


@dataclass
class Export:
    room: Room
    user_id: int
    by: str
    at: datetime
    base: str = ""  # the site's address ("https://chat.example.org"): the files' links are absolute

    def rows(self) -> QuerySet[Message, dict[str, object]]:
        seen = Message.objects.visible_to(self.user_id).filter(room=self.room)
        return seen.order_by("seq").values(*FIELDS)


def record(row: dict[str, object], files: list[dict[str, object]] | None = None) -> dict[str, object]:
    """One message as the admin's transcript has it (a personal reply's `recipient`
    included), plus what a member's export adds: when it was edited or deleted (a
    tombstone: no text), and its files (`file_record`)."""
    out = transcripts.record_of(row)
    out["edited"] = transcripts._iso(row["edited_at"])  # type: ignore[arg-type]
    out["deleted"] = transcripts._iso(row["deleted_at"])  # type: ignore[arg-type]
    out["files"] = files or []
    return out


def file_record(f: Attachment, slug: str, base: str) -> dict[str, object]:
    url = base + reverse("file", args=[slug, f.pk, f.name])
    return {"id": f.pk, "name": f.name, "kind": f.kind, "content_type": f.content_type, "size": f.size, "url": url}


async def _files_of(export: Export, ids: list[int]) -> dict[int, list[dict[str, object]]]:
    """The files of a batch of messages (one query), by message id, in their order."""
    rows = Attachment.objects.filter(message_id__in=ids).defer("text", "page_starts").order_by("position", "id")
    out: dict[int, list[dict[str, object]]] = {}
    async for f in rows:
        assert f.message_id is not None
        out.setdefault(f.message_id, []).append(file_record(f, export.room.slug, export.base))
    return out


async def _records(export: Export) -> AsyncIterator[dict[str, object]]:
    """The export's records, a batch of rows and their files at a time."""
    batch: list[dict[str, object]] = []

    async def flush() -> AsyncIterator[dict[str, object]]:
        files = await _files_of(export, [int(r["id"]) for r in batch])  # type: ignore[call-overload]
        for row in batch:
            yield record(row, files.get(int(row["id"])))  # type: ignore[call-overload]
        batch.clear()

    async for row in export.rows().aiterator(chunk_size=500):
        batch.append(row)
        if len(batch) >= 500:
            async for rec in flush():
                yield rec
    async for rec in flush():
        yield rec


def _file_line(f: dict[str, object]) -> str:
    name = str(f["name"]).replace("[", "\\[").replace("]", "\\]")
    return f"- [{name}]({f['url']}) · {f['content_type']} · {f['size']} bytes"


def markdown(rec: dict[str, object]) -> str:
    if rec["deleted"]:
        head = f"### #{rec['seq']} {rec['author']} · {rec['role']}, deleted · {rec['time']}"
        if rec["recipient"]:
            head += f" · for {rec['recipient']} only"
        return f"{head}\n\n_(deleted {rec['deleted']})_\n\n"
    files = cast(list[dict[str, object]], rec.get("files") or [])
    if files and not rec["text"]:  # a post of files alone: they are its body
        rec = {**rec, "text": "Files:"}
    text = transcripts.markdown_message(rec)  # its heading says "for NAME only" for a personal reply
    if files:
        text = text.rstrip("\n") + "\n\n" + "\n".join(_file_line(f) for f in files)
    note = f"\n\n_(edited {rec['edited']})_" if rec["edited"] else ""
    return text.rstrip("\n") + note + "\n\n"


async def stream(export: Export, fmt: str) -> AsyncIterator[bytes]:
    """The transcript, a few hundred rows at a time (never the whole room in memory)."""
    rows = export.rows()
    records = _records(export)
    if fmt == "json":
        head = {"room": export.room.slug, "name": export.room.name, "exported": transcripts._iso(export.at)}
        head["by"] = export.by
        yield (json.dumps(head, ensure_ascii=False)[:-1] + ', "messages": [\n').encode()
        first = True
        async for rec in records:
            line = json.dumps(rec, ensure_ascii=False)
            yield (("" if first else ",\n") + line).encode()
            first = False
        yield b"\n]}\n"
        return
    count = await sync_to_async(rows.count)()
    yield transcripts.markdown_head(export.room, count, export.at, export.by).encode()
    async for rec in records:
        yield markdown(rec).encode()
