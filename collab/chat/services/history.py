"""A room's history for one member: search it, read it around one message, take it away
(docs/wire.md, "HTTP"). Every read goes through `Message.objects.visible_to(user_id)`:
the shared messages and that member's own personal replies, never anyone else's.

Search is PostgreSQL full-text search (websearch syntax, ranked by the database, shown
newest first, with highlighted excerpts from ts_headline) on PostgreSQL, and a
case-insensitive match of every word on SQLite. Deleted messages are never found.

The export is the admin's transcript format (actions.transcripts: `record_of`,
`markdown_message`), one member's view of one room, streamed row by row.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import datetime

from asgiref.sync import sync_to_async
from django.db import connection
from django.db.models import Q, QuerySet
from django.utils.safestring import SafeString, mark_safe

from collab.chat.errors import ClientError
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
    """What a member's search may find: visible to them, not deleted, with text; of a
    reply's versions, the one the room shows (its page holds no other)."""
    seen = Message.objects.visible_to(user_id).filter(room=room, deleted_at__isnull=True, version_hidden=False)
    return seen.exclude(text="")


def search(room: Room, user_id: int, q: str) -> QuerySet[Message]:
    """The matches, newest first; on PostgreSQL each carries `headline` (ts_headline)."""
    found = searchable(room, user_id)
    if connection.vendor == "postgresql":
        from django.contrib.postgres.search import SearchHeadline, SearchQuery, SearchVector

        query = SearchQuery(q, search_type="websearch", config="english")
        return (
            found.alias(match=SearchVector("text", config="english"))
            .filter(match=query)
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
    terms = _terms(q)
    if not terms:
        return found.none()
    match = Q()
    for term in terms:
        match &= Q(text__icontains=term)
    return found.filter(match).order_by("-seq")


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


def excerpt(message: Message, q: str) -> SafeString:
    headline = getattr(message, "headline", None)
    if headline:
        return _marked(headline)
    return _excerpt_of(message.text, _terms(q))


def around(room: Room, user_id: int, seq: int) -> tuple[list[Message], bool, bool]:
    """The messages a member sees around `seq` (oldest first), and whether there are
    older and newer ones beyond them (of a reply's versions, the one shown, in its slot's place)."""
    seen = Message.objects.visible_to(user_id).filter(room=room, version_hidden=False)
    seen = seen.select_related("reply_to", "recipient")
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

    def rows(self) -> QuerySet[Message, dict[str, object]]:
        seen = Message.objects.visible_to(self.user_id).filter(room=self.room)
        return seen.order_by("seq").values(*FIELDS)


def record(row: dict[str, object]) -> dict[str, object]:
    """One message as the admin's transcript has it (a personal reply's `recipient`
    included), plus what a member's export adds: when it was edited or deleted (a
    tombstone: no text)."""
    out = transcripts.record_of(row)
    out["edited"] = transcripts._iso(row["edited_at"])  # type: ignore[arg-type]
    out["deleted"] = transcripts._iso(row["deleted_at"])  # type: ignore[arg-type]
    return out


def markdown(rec: dict[str, object]) -> str:
    if rec["deleted"]:
        head = f"### #{rec['seq']} {rec['author']} · {rec['role']}, deleted · {rec['time']}"
        if rec["recipient"]:
            head += f" · for {rec['recipient']} only"
        return f"{head}\n\n_(deleted {rec['deleted']})_\n\n"
    text = transcripts.markdown_message(rec)  # its heading says "for NAME only" for a personal reply
    note = f"\n\n_(edited {rec['edited']})_" if rec["edited"] else ""
    return text.rstrip("\n") + note + "\n\n"


async def stream(export: Export, fmt: str) -> AsyncIterator[bytes]:
    """The transcript, a few hundred rows at a time (never the whole room in memory)."""
    rows = export.rows()
    if fmt == "json":
        head = {"room": export.room.slug, "name": export.room.name, "exported": transcripts._iso(export.at)}
        head["by"] = export.by
        yield (json.dumps(head, ensure_ascii=False)[:-1] + ', "messages": [\n').encode()
        first = True
        async for row in rows.aiterator(chunk_size=500):
            line = json.dumps(record(row), ensure_ascii=False)
            yield (("" if first else ",\n") + line).encode()
            first = False
        yield b"\n]}\n"
        return
    count = await sync_to_async(rows.count)()
    yield transcripts.markdown_head(export.room, count, export.at, export.by).encode()
    async for row in rows.aiterator(chunk_size=500):
        yield markdown(record(row)).encode()
