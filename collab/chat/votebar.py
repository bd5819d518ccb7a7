"""A reply's vote bar (`#msg-N-votes`), rendered from its template: in its article (the
`{% vote_bar %}` tag) and in the frame a vote sends (commands/votes.py)."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.template.loader import get_template

from collab.chat.models import Message


@cache
def _bar() -> Any:
    # Loaded on first use, not at import: this module is imported while templates that
    # use {% vote_bar %} are being compiled.
    return get_template("chat/_votes.html")


def names(message: Message, value: str) -> list[str]:
    return [v["voter"] for v in message.votes_by if v.get("value") == value]


def bar(message: Message, oob: bool = False) -> str:
    """The reply's vote bar (`#msg-N-votes`): counts, the voters' names (title; its
    `data-up-by`/`data-down-by` give the viewer's pressed state by CSS, room.html), the
    verdict and, on a rejected reply, the button that reopens it."""
    up, down = names(message, "up"), names(message, "down")
    who = "; ".join(p for p in (f"up: {', '.join(up)}" if up else "", f"down: {', '.join(down)}" if down else "") if p)
    return (
        _bar()
        .render(
            {"m": message, "up_by": " ".join(up), "down_by": " ".join(down), "who": who or "no votes yet", "oob": oob}
        )
        .strip()
    )
