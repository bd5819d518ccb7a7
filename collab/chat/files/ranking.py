"""Which parts of a room's documents (AttachmentPart) match a question: for a model's
context when a document is too long to send whole (for_models.py), and for an agent's
`search_files` (tools.py).

On PostgreSQL the database ranks them: full-text search (`english`), any of the
question's words (`websearch` syntax with `or`), ranked by `ts_rank`. On SQLite (a
development database) a simpler match: the parts that hold any of the words, ranked by
how many distinct words they hold, then how often.
"""

from __future__ import annotations

import re

from django.db import connection
from django.db.models import Q, QuerySet

from collab.chat.file_models import AttachmentPart

MAX_WORDS = 12  # a long question: its longest words
SQLITE_CANDIDATES = 400  # parts read to be ranked in Python, at most

_WORD = re.compile(r"[^\W_]{3,40}", re.UNICODE)
# Words that match everything: never a reason to pick a part.
_COMMON_WORDS = (
    "the and for are but not you all any can had her was one our out has him his how its may new "
    "now see two way who did get let put say she too use what when where which why with this that "
    "from they them then there their these those will would could should about into over than been "
    "have does here just more most some such only also each other your please tell says said"
)
_COMMON = frozenset(_COMMON_WORDS.split())


def words(question: str) -> list[str]:
    """The question's words that can match (lower case, no common words, no @mentions), longest first."""
    text = re.sub(r"@[\w-]+", " ", question.lower())
    found = {w for w in _WORD.findall(text) if w not in _COMMON and not w.isdigit()}
    return sorted(found, key=lambda w: (-len(w), w))[:MAX_WORDS]


def rank_parts(parts: QuerySet[AttachmentPart], question: str, limit: int) -> list[AttachmentPart]:
    """Of `parts`, at most `limit` that match `question`, best first ([]: none matches)."""
    wanted = words(question)
    if not wanted or limit < 1:
        return []
    if connection.vendor == "postgresql":
        return _ranked_by_postgres(parts, wanted, limit)
    return _ranked_by_overlap(parts, wanted, limit)


def _ranked_by_postgres(parts: QuerySet[AttachmentPart], wanted: list[str], limit: int) -> list[AttachmentPart]:
    from django.contrib.postgres.search import SearchQuery, SearchRank, SearchVector

    query = SearchQuery(" or ".join(wanted), search_type="websearch", config="english")
    vector = SearchVector("text", config="english")
    ranked = (
        parts.annotate(rank=SearchRank(vector, query))
        .filter(rank__gt=0)
        .order_by("-rank", "attachment_id", "n")
        .select_related("attachment")
    )
    return list(ranked[:limit])


def _ranked_by_overlap(parts: QuerySet[AttachmentPart], wanted: list[str], limit: int) -> list[AttachmentPart]:
    holds = Q()
    for word in wanted:
        holds |= Q(text__icontains=word)
    candidates = list(
        parts.filter(holds).select_related("attachment").order_by("attachment_id", "n")[:SQLITE_CANDIDATES]
    )

    def score(part: AttachmentPart) -> tuple[int, int]:
        text = part.text.lower()
        counts = [text.count(w) for w in wanted]
        return (sum(1 for c in counts if c), sum(min(c, 5) for c in counts))

    scored = [(score(p), p) for p in candidates]
    scored = [(s, p) for s, p in scored if s[0]]
    scored.sort(key=lambda sp: (-sp[0][0], -sp[0][1], sp[1].attachment_id, sp[1].n))
    return [p for _s, p in scored[:limit]]
