"""The one parser of collab's server frames (docs/wire.md), for the load generator and the tests.

Every pattern of a server frame that a client reads is stated here once: a reply's pieces
(answer and thinking), articles and their attributes and body, the thinking a snapshot or
a final article shows, error frames, the member list. :func:`parse_frame` reads a whole
frame: the load generator parses each distinct frame once per room (its members receive
the same bytes and look it up by them), and :class:`collab.loadtest.frames.Frames`, the
per-client view the tests read the wire with, folds the same :class:`Parsed` into its
replies. Imports nothing from the app: both see only what goes over the wire.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

__all__ = [
    "SNAPSHOT_PREFIX",
    "ArticleInfo",
    "Parsed",
    "Piece",
    "ThinkingShown",
    "articles",
    "attributes",
    "members",
    "not_escaped",
    "parse_frame",
    "thinking_pieces",
    "thinking_shown",
    "words_of_html",
    "words_of_text",
]


def _pieces_re(stream: str) -> re.Pattern[bytes]:
    """A piece of a reply's `body` (its answer) or `thinking` (docs/wire.md): id, offset, TEXT."""
    return re.compile(
        rb'<div id="msg-(\d+)-' + stream.encode() + rb'" hx-swap-oob="beforeend" data-offset="(\d+)">(.*?)</div>',
        re.S,
    )


_DELTA_PREFIX = b'<div id="msg-'
_DELTA = _pieces_re("body")
_THINKING = _pieces_re("thinking")
# In HTML-escaped text (docs/wire.md: a piece's TEXT, a streaming reply's raw body) `<` and `>`
# never appear as themselves, and every `&` starts a character reference.
_NOT_ESCAPED_TEXT = r"[<>]|&(?!(?:[A-Za-z][A-Za-z0-9]*|#[0-9]+|#[xX][0-9A-Fa-f]+);)"
_NOT_ESCAPED = re.compile(_NOT_ESCAPED_TEXT.encode())
_NOT_ESCAPED_STR = re.compile(_NOT_ESCAPED_TEXT)
_ARTICLE = re.compile(r"<article ([^>]*)>(.*?)</article>", re.S)
_ATTR = re.compile(r'([\w-]+)="([^"]*)"')
_BODY = re.compile(
    r'<div id="msg-\d+-body" class="body (raw|md)">(.*?)</div>\s*'
    r'(?:<p class="reason"|<div id="msg-\d+-reactions"|<div id="msg-\d+-tools"|$)',
    re.S,
)
_THINKING_SHOWN = re.compile(  # " md": an agent's ended log, rendered
    r'<div id="msg-(\d+)-thinking" class="thinking-body( md)?"'
    r'(?: data-length="(\d+)")?(?: data-from="(\d+)")?>(.*?)</div>',
    re.S,
)
_ERROR = re.compile(r'<p class="error" data-code="([^"]+)">(.*?)</p>', re.S)
_MEMBER = re.compile(
    r'<li id="member-[0-9]+" class="[^"]*" data-user="([^"]+)" data-online="([01])"(?: hx-swap-oob="true")?>'
)
SNAPSHOT_PREFIX = '<div id="messages" hx-swap-oob="true"'
_NEW = '<div id="messages" hx-swap-oob="beforeend"'
_NEW_IN_THREAD = re.compile(r'<div id="thread-live" hx-swap-oob="beforeend"')  # a thread's new articles
_NONCE = re.compile(r"\blt[0-9a-f]{16}\b")
_TAG = re.compile(r"<[^>]*>")
_WORD = re.compile(r"[A-Za-z_]{2,}")
# A fence's opening line (CommonMark: up to 3 spaces in, 3 or more backticks, an info string).
_FENCE_OPEN = re.compile(r" {0,3}(`{3,})([^`]*)$")


@dataclass(slots=True)
class Piece:
    msg: int
    offset: int
    text: str  # unescaped
    end: int  # offset + len(text): where the next piece must start
    unescaped: int = 0  # characters of its TEXT, as sent, that are not HTML-escaped


@dataclass(slots=True)
class ArticleInfo:
    msg: int
    role: str
    status: str
    attrs: dict[str, str]
    body: str  # raw text (streaming) or rendered HTML (finished), unescaped for raw
    raw: bool
    html: str | None = None  # the body as sent (None: the article has no body)
    unescaped: int = 0  # raw body: its characters, as sent, that are not HTML-escaped
    inner: str = ""  # everything inside the article, as sent (header, thinking, body)


@dataclass(slots=True)
class Parsed:
    kind: str  # delta | new | final | snapshot | error | other
    pieces: list[Piece] = field(default_factory=list)
    articles: list[ArticleInfo] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    nonce: str | None = None  # new: the post this frame answers (the load generator's marker)
    unescaped: int = 0  # delta: characters of its pieces' TEXT that are not HTML-escaped
    _words: list[str] | None = None

    def final_words(self) -> list[str]:
        """Words of the finished article's rendered text (computed once per frame)."""
        if self._words is None:
            self._words = words_of_html(self.articles[0].body) if self.articles else []
        return self._words


@dataclass(slots=True)
class ThinkingShown:
    """The thinking (or agent run log) an article shows whole, not as pieces."""

    msg: int
    length: int | None  # data-length: a reply in progress (snapshot), its thinking so far
    start: int | None  # data-from: only the text from here on is shown (too long for the budget)
    text: str  # unescaped
    rendered: bool = False  # an agent's ended log, as rendered Markdown (text is then HTML)


def not_escaped(raw: str | bytes) -> int:
    """How many characters of `raw`, as it came over the wire, are not HTML-escaped: a
    `<`, a `>`, or an `&` that starts no character reference."""
    if isinstance(raw, bytes):
        return len(_NOT_ESCAPED.findall(raw))
    return len(_NOT_ESCAPED_STR.findall(raw))


def words_of_html(fragment: str) -> list[str]:
    """The words of rendered Markdown: tags dropped, entities decoded."""
    return _WORD.findall(html.unescape(_TAG.sub(" ", fragment)))


def words_of_text(text: str) -> list[str]:
    """The words a Markdown renderer keeps from raw text: a fence's info string is not shown,
    but inside an open fence (a reply cut mid-code) a line like "```python" is code and is.
    "```python" within a line is a code span's backticks, and its word is shown too."""
    kept, fence = [], ""
    for line in text.split("\n"):
        opened = _FENCE_OPEN.match(line)
        if fence:
            if opened and not opened.group(2).strip() and len(opened.group(1)) >= len(fence):
                fence = ""  # a closing fence: backticks only
                continue
        elif opened:
            fence = opened.group(1)
            continue
        kept.append(line)
    return _WORD.findall("\n".join(kept))


def attributes(tag_text: str) -> dict[str, str]:
    """The `name="value"` attributes of a tag's text, values as sent (not unescaped)."""
    return dict(_ATTR.findall(tag_text))


def articles(text: str) -> list[ArticleInfo]:
    """Every article in a frame or a page, in order."""
    out = []
    for m in _ARTICLE.finditer(text):
        attrs = dict(_ATTR.findall(m.group(1)))
        inner = m.group(2)
        body = _BODY.search(inner)
        raw = body is not None and body.group(1) == "raw"
        content = body.group(2) if body is not None else None
        unescaped = 0
        if raw and content:
            unescaped = len(_NOT_ESCAPED_STR.findall(content))
            shown = html.unescape(content)
        else:
            shown = content or ""
        out.append(
            ArticleInfo(
                msg=int(attrs.get("id", "msg-0").removeprefix("msg-")),
                role=attrs.get("data-role", ""),
                status=attrs.get("data-status", ""),
                attrs=attrs,
                body=shown,
                raw=raw,
                html=content,
                unescaped=unescaped,
                inner=inner,
            )
        )
    return out


def _pieces(pattern: re.Pattern[bytes], data: bytes) -> list[Piece]:
    out = []
    for m in pattern.finditer(data):
        raw = m.group(3)
        text = raw.decode("utf-8")
        unescaped = 0
        if b"&" in raw or b"<" in raw or b">" in raw:  # checked as sent, then unescaped
            unescaped = len(_NOT_ESCAPED.findall(raw))
            text = html.unescape(text)
        offset = int(m.group(2))
        out.append(Piece(int(m.group(1)), offset, text, offset + len(text), unescaped))
    return out


def thinking_pieces(data: bytes) -> list[Piece]:
    """The ``msg-N-thinking`` pieces of a frame (text unescaped); [] for any other frame."""
    return _pieces(_THINKING, data)


def thinking_shown(text: str) -> list[ThinkingShown]:
    """The thinking every article of a frame or page shows whole (a snapshot's so far, a
    final article's), in order."""
    return [
        ThinkingShown(
            int(m.group(1)),
            int(m.group(3)) if m.group(3) is not None else None,
            int(m.group(4)) if m.group(4) is not None else None,
            m.group(5) if m.group(2) else html.unescape(m.group(5)),
            bool(m.group(2)),
        )
        for m in _THINKING_SHOWN.finditer(text)
    ]


def members(text: str) -> list[tuple[str, bool]]:
    """The member list (docs/wire.md) in a frame or a page: (username, online), in order."""
    return [(user, online == "1") for user, online in _MEMBER.findall(text)]


def member_list(shown: dict[str, bool], text: str) -> dict[str, bool] | None:
    """The member list as a page shows it after this frame or page (docs/wire.md): a whole
    list replaces it, a presence change updates the members it names; None: no change."""
    found = members(text)
    if not found:
        return None
    if '<ul id="members"' in text:
        return dict(found)
    return {**shown, **dict(found)}


def parse_frame(data: bytes) -> Parsed:
    """What one server frame says: its answer pieces, its articles, its errors."""
    if data.startswith(_DELTA_PREFIX):
        pieces = _pieces(_DELTA, data)
        if pieces:
            return Parsed("delta", pieces=pieces, unescaped=sum(p.unescaped for p in pieces))
    text = data.decode("utf-8", "replace")
    if text.startswith(SNAPSHOT_PREFIX):
        return Parsed("snapshot", articles=articles(text))
    if text.startswith(_NEW) or _NEW_IN_THREAD.match(text):
        found = articles(text)
        nonce = None
        for a in found:
            if a.role == "user":
                marker = _NONCE.search(a.body)
                if marker:
                    nonce = marker.group()
        return Parsed("new", articles=found, nonce=nonce)
    if text.startswith("<article "):
        found = articles(text)
        if found and found[0].attrs.get("hx-swap-oob") == "true":
            return Parsed("final", articles=found)
        return Parsed("other", articles=found)
    errors = [(code, html.unescape(msg)) for code, msg in _ERROR.findall(text)]
    if errors:
        return Parsed("error", errors=errors)
    return Parsed("other")
