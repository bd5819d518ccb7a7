"""Event -> HTML fragment, through templates only (auto-escaped).

Each frame is rendered once by whoever broadcasts it and sent as-is to every member.
Model and user text is never a top-level element: htmx swaps top-level elements by id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.template.loader import get_template

from collab.chat.models import Message

_article = get_template("chat/_article.html")
_messages = get_template("chat/_frame_messages.html")
_delta = get_template("chat/_frame_delta.html")
_error = get_template("chat/_frame_error.html")
_members = get_template("chat/_members.html")
_state = get_template("chat/_frame_state.html")


def article(message: Message, *, live_text: str | None = None, oob: bool = False, state: str = "") -> str:
    """One message. `live_text` is the text so far of a reply still streaming here."""
    return _article.render({"m": message, "live_text": live_text, "oob": oob, "state": state})


def frame_new(messages: Iterable[Message]) -> str:
    """New messages appended to the room's list."""
    return _messages.render({"messages": list(messages), "mode": "append"}).strip()


def frame_final(message: Message) -> str:
    """A message sent again whole: a finished reply, or an edit of its state."""
    return article(message, oob=True).strip()


def frame_delta(message_id: int, offset: int, text: str) -> str:
    return _delta.render({"id": message_id, "offset": offset, "text": text}).strip()


def frame_snapshot(
    messages: Sequence[Message],
    live_texts: dict[int, str],
    *,
    has_older: bool,
    room_slug: str,
    states: dict[int, str] | None = None,
) -> str:
    """The room's recent messages, replacing the list: the first frame after (re)connect.
    `states` are the labels of streaming replies ("queued (2 ahead)")."""
    states = states or {}
    items = [(m, live_texts.get(m.id), states.get(m.id, "")) for m in messages]
    return _messages.render(
        {
            "items": items,
            "mode": "replace",
            "has_older": has_older,
            "room_slug": room_slug,
            "oldest_seq": messages[0].seq if messages else 0,
        }
    ).strip()


def frame_state(message_id: int, text: str) -> str:
    """The state label of a streaming reply (queued, writing)."""
    return _state.render({"id": message_id, "text": text}).strip()


def frame_error(code: str, text: str) -> str:
    return _error.render({"code": code, "text": text}).strip()


def frame_members(members: Sequence[dict[str, object]]) -> str:
    return _members.render({"members": members, "oob": True}).strip()
