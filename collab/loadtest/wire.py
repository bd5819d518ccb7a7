"""Server frames (docs/wire.md) parsed once per distinct frame, for the load generator.

Every member of a room receives the same bytes for the same frame, so a room parses a
frame the first time one of its members receives it and the others look it up by its
bytes: the per-member cost of a piece is a dict lookup and an offset check.
:mod:`collab.loadtest.frames` is the readable, per-client version the tests use.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

__all__ = ["ArticleInfo", "Parsed", "Piece", "parse_frame", "words_of_html", "words_of_text"]

_DELTA_PREFIX = b'<div id="msg-'
_DELTA = re.compile(
    rb'<div id="msg-(\d+)-body" hx-swap-oob="beforeend" data-offset="(\d+)">(.*?)</div>',
    re.S,
)
# Not HTML-escaped (docs/wire.md: a piece's TEXT is): `<`, `>`, or an `&` that starts no
# character reference.
_NOT_ESCAPED = re.compile(rb"[<>]|&(?!(?:[A-Za-z][A-Za-z0-9]*|#[0-9]+|#[xX][0-9A-Fa-f]+);)")
ARTICLE_RE = re.compile(r"<article ([^>]*)>(.*?)</article>", re.S)
ATTR_RE = re.compile(r'([\w-]+)="([^"]*)"')
BODY_RE = re.compile(
    r'<div id="msg-\d+-body" class="body (raw|md)">(.*?)</div>\s*(?:<p class="reason"|$)',
    re.S,
)
ERROR_RE = re.compile(r'<p class="error" data-code="([^"]+)">(.*?)</p>', re.S)
SNAPSHOT_PREFIX = '<div id="messages" hx-swap-oob="true"'
_NEW = '<div id="messages" hx-swap-oob="beforeend"'
_NONCE = re.compile(r"\blt[0-9a-f]{16}\b")
_TAG = re.compile(r"<[^>]*>")
_WORD = re.compile(r"[A-Za-z_]{2,}")
_FENCE_INFO = re.compile(r"```[A-Za-z_]*")


@dataclass(slots=True)
class Piece:
    msg: int
    offset: int
    text: str
    end: int  # offset + len(text): where the next piece must start


@dataclass(slots=True)
class ArticleInfo:
    msg: int
    role: str
    status: str
    attrs: dict[str, str]
    body: str  # raw text (streaming) or rendered HTML (finished), unescaped for raw
    raw: bool


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


def words_of_html(fragment: str) -> list[str]:
    """The words of rendered Markdown: tags dropped, entities decoded."""
    return _WORD.findall(html.unescape(_TAG.sub(" ", fragment)))


def words_of_text(text: str) -> list[str]:
    """The words a Markdown renderer keeps from raw text (a fence's info string is not shown)."""
    return _WORD.findall(_FENCE_INFO.sub(" ", text))


def _articles(text: str) -> list[ArticleInfo]:
    out = []
    for m in ARTICLE_RE.finditer(text):
        attrs = dict(ATTR_RE.findall(m.group(1)))
        body = BODY_RE.search(m.group(2))
        raw = body is not None and body.group(1) == "raw"
        content = body.group(2) if body is not None else ""
        out.append(
            ArticleInfo(
                msg=int(attrs.get("id", "msg-0").removeprefix("msg-")),
                role=attrs.get("data-role", ""),
                status=attrs.get("data-status", ""),
                attrs=attrs,
                body=html.unescape(content) if raw else content,
                raw=raw,
            )
        )
    return out


def parse_frame(data: bytes) -> Parsed:
    """What one server frame says, as the load generator needs it."""
    if data.startswith(_DELTA_PREFIX):
        pieces = []
        unescaped = 0
        for m in _DELTA.finditer(data):
            raw = m.group(3)
            text = raw.decode("utf-8")
            if b"&" in raw or b"<" in raw or b">" in raw:  # checked as sent, then unescaped
                unescaped += len(_NOT_ESCAPED.findall(raw))
                text = html.unescape(text)
            offset = int(m.group(2))
            pieces.append(Piece(int(m.group(1)), offset, text, offset + len(text)))
        if pieces:
            return Parsed("delta", pieces=pieces, unescaped=unescaped)
    text = data.decode("utf-8", "replace")
    if text.startswith(SNAPSHOT_PREFIX):
        return Parsed("snapshot", articles=_articles(text))
    if text.startswith(_NEW):
        articles = _articles(text)
        nonce = None
        for a in articles:
            if a.role == "user":
                found = _NONCE.search(a.body)
                if found:
                    nonce = found.group()
        return Parsed("new", articles=articles, nonce=nonce)
    if text.startswith("<article "):
        articles = _articles(text)
        if articles and articles[0].attrs.get("hx-swap-oob") == "true":
            return Parsed("final", articles=articles)
        return Parsed("other", articles=articles)
    errors = [(code, html.unescape(msg)) for code, msg in ERROR_RE.findall(text)]
    if errors:
        return Parsed("error", errors=errors)
    return Parsed("other")
