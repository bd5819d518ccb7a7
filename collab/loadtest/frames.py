"""Read collab's server frames as a client does (docs/wire.md), and check each reply's integrity.

Imports nothing from the app: the load generator and the tests both use it, and both
see only what goes over the wire.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

from collab.loadtest.wire import ARTICLE_RE as _ARTICLE
from collab.loadtest.wire import ATTR_RE as _ATTR
from collab.loadtest.wire import BODY_RE as _BODY
from collab.loadtest.wire import ERROR_RE as _ERROR
from collab.loadtest.wire import SNAPSHOT_PREFIX as _SNAPSHOT

_DELTA = re.compile(r'<div id="msg-(\d+)-body" hx-swap-oob="beforeend" data-offset="(\d+)">(.*?)</div>', re.S)
# In HTML-escaped text (docs/wire.md: a piece's TEXT, a streaming reply's raw body) `<` and `>`
# never appear as themselves, and every `&` starts a character reference.
_NOT_ESCAPED = re.compile(r"[<>]|&(?!(?:[A-Za-z][A-Za-z0-9]*|#[0-9]+|#[xX][0-9A-Fa-f]+);)")


def not_escaped(raw: str) -> int:
    """How many characters of `raw`, as it came over the wire, are not HTML-escaped: a
    `<`, a `>`, or an `&` that starts no character reference."""
    return len(_NOT_ESCAPED.findall(raw))


@dataclass
class Reply:
    """What one client saw of one message."""

    id: int
    seq: int = 0
    role: str = ""
    author: str = ""
    status: str = ""
    text: str = ""  # raw text assembled from the snapshot and the pieces, up to the first gap
    pieces: int = 0
    first_piece_at: float | None = None
    piece_times: list[tuple[int, float]] = field(default_factory=list)  # (end offset, arrival)
    final_attrs: dict[str, str] = field(default_factory=dict)
    final_html: str = ""
    snapshot_mismatch: int = 0  # characters between a snapshot's text and its data-length
    duplicated: int = 0  # characters shown twice (a piece starting before the end of the text)
    out_of_order: int = 0  # characters of pieces that came before a piece they follow
    unescaped: int = 0  # characters of raw text (pieces, streaming body) not HTML-escaped
    ahead: dict[int, str] = field(default_factory=dict)  # pieces past a gap, by offset
    ended_at: float | None = None

    @property
    def lost(self) -> int:
        """Characters this client was never shown: the gaps before the pieces held past
        them (a piece that comes later closes its gap), and a snapshot's text that is
        not as long as its data-length says."""
        gaps, have = 0, len(self.text)
        for offset in sorted(self.ahead):
            gaps += max(0, offset - have)
            have = max(have, offset + len(self.ahead[offset]))
        return self.snapshot_mismatch + gaps


@dataclass
class Frames:
    """Folds frames into per-message state, counting integrity faults as it goes."""

    replies: dict[int, Reply] = field(default_factory=dict)
    errors: list[tuple[str, str]] = field(default_factory=list)
    snapshots: int = 0
    frames: int = 0

    def reply(self, msg_id: int) -> Reply:
        r = self.replies.get(msg_id)
        if r is None:
            r = self.replies[msg_id] = Reply(msg_id)
        return r

    def feed(self, frame: str, at: float = 0.0) -> None:
        self.frames += 1
        if frame.startswith('<div id="msg-'):
            for m in _DELTA.finditer(frame):
                self._piece(int(m.group(1)), int(m.group(2)), m.group(3), at)
            return
        if frame.startswith(_SNAPSHOT):
            self.snapshots += 1
        for m in _ARTICLE.finditer(frame):
            self._article(m.group(1), m.group(2), at)
        for code, text in _ERROR.findall(frame):
            self.errors.append((code, html.unescape(text)))

    def _piece(self, msg_id: int, offset: int, raw: str, at: float) -> None:
        """One piece, its TEXT as it came over the wire: checked for escaping, then
        unescaped. A piece past the end of the text is held until the gap closes."""
        r = self.reply(msg_id)
        r.unescaped += not_escaped(raw)
        text = html.unescape(raw)
        r.pieces += 1
        if r.first_piece_at is None:
            r.first_piece_at = at
        if offset > len(r.text):
            held = r.ahead.get(offset, "")
            r.duplicated += min(len(held), len(text))  # the same early piece twice
            r.ahead[offset] = max(held, text, key=len)
            r.piece_times.append((offset + len(text), at))
            return
        r.text += self._after(r, offset, text)
        while r.ahead and min(r.ahead) <= len(r.text):  # pieces that came early fit now
            early_at = min(r.ahead)
            early = self._after(r, early_at, r.ahead.pop(early_at))
            r.out_of_order += len(early)
            r.text += early
        r.piece_times.append((len(r.text), at))

    @staticmethod
    def _after(r: Reply, offset: int, text: str) -> str:
        """What `text` at `offset` adds to the text so far; its overlap counts as duplicated."""
        overlap = min(len(r.text) - offset, len(text))
        r.duplicated += overlap
        return text[overlap:]

    def _article(self, attr_text: str, inner: str, at: float) -> None:
        attrs = dict(_ATTR.findall(attr_text))
        msg_id = int(attrs["id"].removeprefix("msg-"))
        r = self.reply(msg_id)
        r.seq = int(attrs.get("data-seq", 0))
        r.role = attrs.get("data-role", "")
        r.author = html.unescape(attrs.get("data-author", ""))
        r.status = attrs.get("data-status", "")
        body = _BODY.search(inner)
        if attrs.get("hx-swap-oob") == "true":  # a whole article sent again: the end of a reply
            r.final_attrs = attrs
            r.final_html = body.group(2) if body else ""
            r.ended_at = at
        elif "data-length" in attrs and body is not None:  # a reply in progress, on (re)connect
            r.unescaped += not_escaped(body.group(2))
            r.text = html.unescape(body.group(2))
            r.ahead.clear()
            if len(r.text) != int(attrs["data-length"]):
                r.snapshot_mismatch += abs(len(r.text) - int(attrs["data-length"]))
        elif body is not None and body.group(1) == "raw" and not r.text:
            r.unescaped += not_escaped(body.group(2))
            r.text = html.unescape(body.group(2))
