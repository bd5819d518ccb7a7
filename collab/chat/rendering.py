"""Event -> HTML fragment, through templates only (auto-escaped).

Each frame is rendered once by whoever broadcasts it and sent as-is to every member.
Model and user text is never a top-level element: htmx swaps top-level elements by id.

Byte budgets (UTF-8, settings.COLLAB may override each): Daphne refuses to send a
WebSocket message over 1 MiB and closes the socket with 1011 instead, so no frame may
grow with the room's history. A snapshot, and every page of history, holds the newest
messages that fit its budget; a finished message whose HTML is long is shown cut (an
excerpt of its text and a "show all" button that loads it whole: views.message_full);
a streaming reply's live text is never cut inside, but a very long one is sent as its
tail (`data-from`), so that its `data-length` and the offsets that follow still hold.
"""

from __future__ import annotations

import html as html_lib
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.template.base import TextNode, Variable, VariableNode
from django.template.loader import get_template

from collab.chat import attached
from collab.chat.models import Message, room_order

log = logging.getLogger(__name__)

_article = get_template("chat/_article.html")
_messages = get_template("chat/_frame_messages.html")
_older_page = get_template("chat/_older_page.html")
_delta = get_template("chat/_frame_delta.html")
_thinking = get_template("chat/_frame_thinking.html")
_error = get_template("chat/_frame_error.html")
_state = get_template("chat/_frame_state.html")

KIB = 1024
BUDGETS: dict[str, int] = {
    # The first frame of a socket (messages and member list), and each page of history.
    "SNAPSHOT_BYTES": 256 * KIB,
    # An article in a snapshot or a page of history whose HTML is longer is cut.
    "ARTICLE_BYTES": 16 * KIB,
    # ... and in a "new" or "final" frame.
    "FRAME_ARTICLE_BYTES": 128 * KIB,
    # What a cut article shows of its text.
    "EXCERPT_CHARS": 1500,
    # The member list names at most this many members, online ones first.
    "MEMBERS_LISTED": 100,
}


def budget(name: str) -> int:
    return int(settings.COLLAB.get(name, BUDGETS[name]))


def size(text: str) -> int:
    """Bytes of `text` on the wire (UTF-8)."""
    return len(text.encode())


def _over(text: str, limit: int) -> bool:
    """size(text) > limit, without encoding a text that is surely over or under it."""
    return len(text) > limit or (len(text) * 4 > limit and size(text) > limit)


def _excerpt(text: str) -> str:
    """The start of a long text, cut at a line or word break when there is one nearby."""
    limit = budget("EXCERPT_CHARS")
    if len(text) <= limit:
        return text.rstrip()
    head = text[:limit]
    for sep in ("\n", " "):
        at = head.rfind(sep)
        if at > limit // 2:
            return head[:at].rstrip()
    return head


def asker(message: Message, askers: Mapping[int, str] | None = None) -> str:
    """Who asked for a reply still streaming (their Stop button shows only to them, and to
    the room's moderators): the question's author, when its row is at hand (loaded with
    the reply, or among `askers`, the authors of a list's messages by id); else ""."""
    if message.status != Message.Status.STREAMING or message.reply_to_id is None:
        return ""
    if Message.reply_to.is_cached(message):
        return message.reply_to.author_name if message.reply_to is not None else ""
    return (askers or {}).get(message.reply_to_id, "")


def answers_edited(message: Message, edited: Mapping[int, datetime] | None = None) -> bool:
    """A reply made before its question was edited (actions.editing): from the question
    when its row is at hand, or from `edited` (edited_at by id, of a list's messages)."""
    if message.role != Message.Role.ASSISTANT or message.reply_to_id is None:
        return False
    if Message.reply_to.is_cached(message):
        at = message.reply_to.edited_at if message.reply_to is not None else None
    else:
        at = (edited or {}).get(message.reply_to_id)
    return at is not None and at > message.created_at


def recipient(message: Message) -> str:
    """A personal reply's recipient (`data-recipient`), "" for a shared message. The
    callers load it with the message (select_related) or create it with the user."""
    if message.recipient_id is None:
        return ""
    if Message.recipient.is_cached(message) and message.recipient is not None:
        return message.recipient.get_username()
    return str(message.recipient_id)  # not loaded: never a query here (frames render on the event loop)


def article(
    message: Message,
    *,
    live_text: str | None = None,
    live_from: int = 0,
    oob: bool = False,
    state: str = "",
    limit: int | None = None,
    compact: bool = False,
    askers: Mapping[int, str] | None = None,
    edited: Mapping[int, datetime] | None = None,
    live_thinking: str | None = None,
    thinking_from: int = 0,
) -> str:
    """One message. `live_text` is the text so far of a reply still streaming here, from
    character `live_from` on (0: all of it). A finished message whose HTML is over `limit`
    bytes is cut to an excerpt and a "show all" button; `compact`: the button alone."""
    cut = message.status != Message.Status.STREAMING and (compact or (limit is not None and _over(message.html, limit)))
    thinking_cut = bool(message.reasoning) and limit is not None and _over(message.reasoning, limit)
    return _article.render(
        {
            "m": message,
            "asker": asker(message, askers),
            "recipient": recipient(message),
            "answers_edited": answers_edited(message, edited),
            "live_text": live_text,
            "live_from": live_from,
            "live_length": live_from + len(live_text) if live_text is not None else 0,
            # A reasoning model's thinking (the `<details>` block): live, from `thinking_from` on,
            # or stored; cut to an excerpt where the answer would be (its "show all" has it whole).
            "live_thinking": live_thinking,
            "thinking_from": thinking_from,
            "thinking_length": thinking_from + len(live_thinking) if live_thinking is not None else 0,
            "reasoning": "" if compact else _excerpt(message.reasoning) if thinking_cut else message.reasoning,
            "reasoning_cut": thinking_cut,
            "reasoning_html": "" if compact or thinking_cut else message.reasoning_html,
            "oob": oob,
            "state": state,
            "cut": cut,
            "excerpt": _excerpt(message.text) if cut and not compact else "",
            # A person's message's files (chat/attached.py: loaded with its list, or left by
            # its post; never a query on the event loop); a compact article: none.
            "files": [] if compact else attached.of(message),
        }
    )


def frame_new(messages: Iterable[Message]) -> str:
    """New messages appended to the room's list."""
    limit = budget("FRAME_ARTICLE_BYTES")
    articles = [article(m, limit=limit) for m in messages]
    return _messages.render({"articles": articles, "mode": "append"}).strip()


def frame_final(message: Message) -> str:
    """A message sent again whole: a finished reply, or an edit of its state. Cut (with
    its "show all" button) if its HTML is over the frame's budget for an article."""
    return article(message, oob=True, limit=budget("FRAME_ARTICLE_BYTES")).strip()


Piece = Callable[[int, int, str], str]  # (message id, offset, text) -> a piece's frame


def _stamped(template: Any) -> Piece:
    """A piece's frame template (`id`, `offset`, `text`), rendered once with a marker for
    each value and then filled per frame by joining strings: the template's own HTML
    (tests/test_rendering.py) for a small part of its cost, paid for every frame of every
    streaming reply (docs/benchmarks/2026-12-04.md#b-frame-path). The ids and
    offsets as `str()` writes them, the text (a plain `str`, never marked safe) escaped
    as Django escapes it. A template that is anything but text and the three values,
    each shown once as it is (no filter, no tag), fails the checks below and is rendered
    as usual."""

    def rendered(message_id: int, offset: int, text: str) -> str:
        return str(template.render({"id": message_id, "offset": offset, "text": text})).strip()

    nodes = list(template.template.nodelist)
    shown: list[object] = [
        node.filter_expression.var.var
        for node in nodes
        if isinstance(node, VariableNode)
        and not node.filter_expression.filters
        and isinstance(node.filter_expression.var, Variable)
    ]
    texts = sum(isinstance(node, TextNode) for node in nodes)
    if sorted(map(str, shown)) != ["id", "offset", "text"] or texts + len(shown) != len(nodes):
        log.warning("%s: not stamped (it does more than show its values)", template.origin.template_name)
        return rendered
    marks = {"id": "\x00i\x00", "offset": "\x00o\x00", "text": "\x00t\x00"}
    parts = re.split("(\x00[iot]\x00)", rendered(marks["id"], marks["offset"], marks["text"]))  # type: ignore[arg-type]
    if sorted(parts[1::2]) != sorted(marks.values()):
        log.warning("%s: not stamped (its values are not each shown once)", template.origin.template_name)
        return rendered
    # "{0}" the id, "{1}" the offset, "{2}" the text; the template's own braces doubled.
    slots = {"\x00i\x00": "{0}", "\x00o\x00": "{1}", "\x00t\x00": "{2}"}
    fmt = "".join(slots[p] if i % 2 else p.replace("{", "{{").replace("}", "}}") for i, p in enumerate(parts))

    def stamped(message_id: int, offset: int, text: str) -> str:
        return fmt.format(message_id, offset, html_lib.escape(text))

    samples = ((7, 0, ""), (1234567, 89012345, " <a href='x'>&amp;\"</a>\n"), (1, 2, "é ✓ 𝄞"))
    if any(stamped(*s) != rendered(*s) for s in samples):
        log.warning("%s: not stamped (its HTML differs from the template's)", template.origin.template_name)
        return rendered
    return stamped


frame_delta: Piece = _stamped(_delta)  # a piece of a reply's answer (`msg-N-body`)
frame_thinking: Piece = _stamped(_thinking)  # a piece of its thinking (`msg-N-thinking`), at its own offset


@dataclass
class Page:
    """The newest messages of a list that fit a budget, rendered, oldest first."""

    articles: list[str]
    shown: list[Message]
    has_older: bool

    @property
    def oldest_seq(self) -> int:
        return self.shown[0].seq if self.shown else 0


def _tail_start(text: str, room: int) -> int:
    """The smallest start whose tail of `text`, escaped, fits `room` bytes."""
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi) // 2
        if size(html_lib.escape(text[mid:])) <= room:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _kept(memo: dict[tuple[object, ...], str] | None, m: Message, how: tuple[object, ...], make: Any) -> str:
    if memo is None or m.recipient_id is not None:  # a personal reply: its recipient's alone
        return str(make())
    key = (m.id, *how)
    html = memo.get(key)
    if html is None:
        html = memo[key] = make()
    return html


def fit(
    messages: Sequence[Message],
    room: int,
    *,
    has_older: bool,
    live_texts: dict[int, str] | None = None,
    states: dict[int, str] | None = None,
    live_thinking: dict[int, str] | None = None,
    memo: dict[tuple[object, ...], str] | None = None,
) -> Page:
    """The newest of `messages` (oldest first) whose articles fit `room` bytes.

    Replies streaming here (`live_texts`) come first: every message from the oldest of
    them on is shown, the others at least compact (a "show all" button), so the list has
    no hole; each live text, newest first, is shown whole if it fits what is left of half
    the budget, else its tail (its thinking, `live_thinking`, likewise: at most
    ARTICLE_BYTES of it, from that half). Then,
    newest first, messages get their full article (cut to an excerpt over ARTICLE_BYTES)
    while they fit; the first that does not ends the page. `memo`: articles of shared
    messages not streaming here, kept by the caller for the next page of the same
    messages (a room's snapshots: services/snapshot_cache.py), by what they depend on."""
    live_texts = live_texts or {}
    states = states or {}
    askers = {m.id: m.author_name for m in messages if m.role == Message.Role.USER}
    edited = {m.id: m.edited_at for m in messages if m.edited_at is not None}
    limit = budget("ARTICLE_BYTES")
    n = len(messages)
    live = [i for i, m in enumerate(messages) if m.id in live_texts]
    chosen: dict[int, str] = {}
    for i in range(live[0] if live else n, n):
        if messages[i].id not in live_texts:
            chosen[i] = _kept(memo, messages[i], ("compact",), lambda m=messages[i]: article(m, compact=True))
    used = sum(size(a) for a in chosen.values())
    live_room = room // 2  # for live text: the newest messages keep the other half
    for i in reversed(live):
        m, text = messages[i], live_texts[messages[i].id]
        state = states.get(m.id, "")
        think = (live_thinking or {}).get(m.id, "")
        t_room = max(0, min(limit, live_room // 2))
        t_from = 0 if size(html_lib.escape(think)) <= t_room else _tail_start(think, t_room)
        frame = size(
            article(
                m,
                live_text="",
                live_from=len(text),
                state=state,
                askers=askers,
                live_thinking=think[t_from:],
                thinking_from=t_from,
            )
        )
        avail = min(live_room, room - used - frame)
        start = 0 if size(html_lib.escape(text)) <= avail else _tail_start(text, avail)
        chosen[i] = article(
            m,
            live_text=text[start:],
            live_from=start,
            state=state,
            askers=askers,
            live_thinking=think[t_from:],
            thinking_from=t_from,
        )
        live_room -= size(chosen[i]) - frame + size(html_lib.escape(think[t_from:]))
        used += size(chosen[i])
    first = live[0] if live else n
    for i in reversed(range(n)):
        if messages[i].id in live_texts:
            continue
        m = messages[i]
        full = _kept(
            memo, m, ("full", edited.get(m.reply_to_id or 0)), lambda m=m: article(m, limit=limit, edited=edited)
        )
        extra = size(full) - (size(chosen[i]) if i in chosen else 0)
        if used + extra > room:
            break
        chosen[i], used, first = full, used + extra, min(first, i)
    # Shown in the room's order: a later version of a reply in its slot's place (slot_seq).
    order = sorted(range(first, n), key=lambda i: room_order(messages[i]))
    return Page([chosen[i] for i in order], list(messages[first:]), has_older or first > 0)


def frame_snapshot(
    messages: Sequence[Message],
    live_texts: dict[int, str],
    *,
    has_older: bool,
    room_slug: str,
    states: dict[int, str] | None = None,
    members_html: str = "",
    live_thinking: dict[int, str] | None = None,
    memo: dict[tuple[object, ...], str] | None = None,
) -> tuple[str, Page]:
    """The room's recent messages, replacing the list: the first frame after (re)connect,
    sent with `members_html`; together they fit SNAPSHOT_BYTES. `states` are the labels
    of streaming replies ("queued (2 ahead)")."""
    context = {"mode": "replace", "has_older": True, "room_slug": room_slug, "oldest_seq": 2**62, "articles": []}
    shell = size(_messages.render(context).strip())
    room = budget("SNAPSHOT_BYTES") - shell - size(members_html)
    page = fit(
        messages,
        room,
        has_older=has_older,
        live_texts=live_texts,
        states=states,
        live_thinking=live_thinking,
        memo=memo,
    )
    context.update(has_older=page.has_older, oldest_seq=page.oldest_seq, articles=page.articles)
    return _messages.render(context).strip(), page


def history_page(messages: Sequence[Message], *, has_older: bool) -> Page:
    """A page of history (the room page's list, an "older messages" page) within the
    snapshot's budget."""
    return fit(messages, budget("SNAPSHOT_BYTES") - 1 * KIB, has_older=has_older)


def older_page(page: Page, slug: str) -> str:
    return _older_page.render(
        {"articles": page.articles, "has_older": page.has_older, "oldest_seq": page.oldest_seq, "slug": slug}
    )


def frame_state(message_id: int, text: str) -> str:
    """The state label of a streaming reply (queued, writing)."""
    return _state.render({"id": message_id, "text": text}).strip()


def frame_error(code: str, text: str) -> str:
    return _error.render({"code": code, "text": text}).strip()
