"""A client's view of collab's server frames (docs/wire.md), and each reply's integrity.

:class:`Frames` folds what :func:`collab.loadtest.wire.parse_frame` reads from each frame
into per-message state, counting gaps, repeats, pieces out of order and text that is not
HTML-escaped as it goes: what the tests read the wire with. Imports nothing from the app.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from collab.loadtest.wire import ArticleInfo, not_escaped, parse_frame

__all__ = ["Frames", "Reply"]


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
        parsed = parse_frame(frame.encode("utf-8"))
        if parsed.kind == "snapshot":
            self.snapshots += 1
        for p in parsed.pieces:
            self._piece(p.msg, p.offset, p.text, p.unescaped, at)
        for a in parsed.articles:
            self._article(a, at)
        self.errors.extend(parsed.errors)

    def _piece(self, msg_id: int, offset: int, text: str, unescaped: int, at: float) -> None:
        """One piece (its TEXT unescaped; `unescaped`: its characters, as sent, that were
        not escaped). A piece past the end of the text is held until the gap closes."""
        r = self.reply(msg_id)
        r.unescaped += unescaped
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

    def _article(self, a: ArticleInfo, at: float) -> None:
        attrs = a.attrs
        r = self.reply(a.msg)
        r.seq = int(attrs.get("data-seq", 0))
        r.role = a.role
        r.author = html.unescape(attrs.get("data-author", ""))
        r.status = a.status
        if attrs.get("hx-swap-oob") == "true":  # a whole article sent again: the end of a reply
            r.final_attrs = attrs
            r.final_html = a.html or ""
            r.ended_at = at
        elif "data-length" in attrs and a.html is not None:  # a reply in progress, on (re)connect
            r.unescaped += a.unescaped if a.raw else not_escaped(a.html)
            r.text = a.body if a.raw else html.unescape(a.html)
            r.ahead.clear()
            if len(r.text) != int(attrs["data-length"]):
                r.snapshot_mismatch += abs(len(r.text) - int(attrs["data-length"]))
        elif a.raw and not r.text:
            r.unescaped += a.unescaped
            r.text = a.body
