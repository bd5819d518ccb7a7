"""A message's reaction bar (`#msg-N-reactions`), rendered from its template: in its
article (the `{% reaction_bar m %}` tag) and in the frame a reaction sends
(commands/reactions.py). Made from `Message.reactions` alone: no query, so an article
costs the same number of queries with reactions as without.

The bar is the same for every member (one frame to the room): each emoji's button names
who gave it (`data-by`, space-separated usernames, and a tooltip), and the page marks the
viewer's own as pressed (static/collab/reactions.js compares `data-by` with the page's
`data-me`), which costs nothing on the server per member.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.template.loader import get_template

from collab.chat import emojis
from collab.chat.models import Message


@cache
def _bar() -> Any:
    # Loaded on first use, not at import: this module is imported while templates that
    # use {% reaction_bar %} are being compiled.
    return get_template("chat/_reactions.html")


def _who(names: list[str]) -> str:
    if len(names) <= 2:
        return " and ".join(names)
    return f"{', '.join(names[:-1])} and {names[-1]}"


def items(message: Message) -> list[dict[str, object]]:
    """One entry per emoji given: the emoji, its name, how many gave it, who."""
    out: list[dict[str, object]] = []
    for i, entry in enumerate(message.reactions or ()):
        names = [str(n) for n in entry.get("by", ())]
        if not names:
            continue
        emoji = str(entry.get("emoji", ""))
        out.append(
            {"i": i, "emoji": emoji, "name": emojis.name_of(emoji), "count": len(names), "by": " ".join(names)}
            | {"who": _who(names)}
        )
    return out


def bar(message: Message, oob: bool = False) -> str:
    """The message's reaction bar: a toggle button per emoji given (pressed for the
    viewer's own, by the page), who gave it on hover or focus, and the picker's button."""
    return _bar().render({"m": message, "items": items(message), "oob": oob}).strip()
