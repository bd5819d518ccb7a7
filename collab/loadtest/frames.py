"""Read collab's server frames as a client does (WIRE.md), and check each reply's integrity.

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


@dataclass
class Reply:
    """What one client saw of one message."""

    id: int
    seq: int = 0
    role: str = ""
    author: str = ""
    status: str = ""
    text: str = ""  # raw text assembled from the snapshot and the pieces
    pieces: int = 0
    first_piece_at: float | None = None
    piece_times: list[tuple[int, float]] = field(default_factory=list)  # (end offset, arrival)
    final_attrs: dict[str, str] = field(default_factory=dict)
    final_html: str = ""
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    ended_at: float | None = None


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
                self._piece(int(m.group(1)), int(m.group(2)), html.unescape(m.group(3)), at)
            return
        if frame.startswith(_SNAPSHOT):
            self.snapshots += 1
        for m in _ARTICLE.finditer(frame):
            self._article(m.group(1), m.group(2), at)
        for code, text in _ERROR.findall(frame):
            self.errors.append((code, html.unescape(text)))

    def _piece(self, msg_id: int, offset: int, text: str, at: float) -> None:
        r = self.reply(msg_id)
        have = len(r.text)
        if offset > have:
            r.lost += offset - have
            r.out_of_order += 1
            r.text += "\0" * (offset - have)  # keep later offsets aligned
        elif offset < have:
            overlap = min(have - offset, len(text))
            r.duplicated += overlap
            text = text[overlap:]
        r.text += text
        r.pieces += 1
        if r.first_piece_at is None:
            r.first_piece_at = at
        r.piece_times.append((len(r.text), at))

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
            r.text = html.unescape(body.group(2))
            if len(r.text) != int(attrs["data-length"]):
                r.lost += abs(len(r.text) - int(attrs["data-length"]))
        elif body is not None and body.group(1) == "raw" and not r.text:
            r.text = html.unescape(body.group(2))
