"""`{% avatar name %}` and `{% assistant_card m %}` (collab/chat/people.py): avatars beside
every message and member, and the card behind an assistant's name on its reply."""

from __future__ import annotations

from functools import cache, lru_cache
from typing import Any

from django import template
from django.template.loader import get_template
from django.utils.safestring import SafeString, mark_safe

from collab.chat import people
from collab.chat.models import Message

register = template.Library()


@cache
def _template(name: str) -> Any:
    return get_template(name)  # on first use: these tags are loaded while templates compile


# Every article renders both (a reply's "new" and final frames, each snapshot): the same few
# names and assistants over and over, so each is rendered once per process and kept (a
# render is ~20 µs, a third of what these parts added to an article; docs/benchmarks.md).
@lru_cache(maxsize=4096)
def _avatar(name: str, picture: str, bot: bool) -> SafeString:
    html = _template("chat/_avatar.html").render({"a": people.avatar(name, picture, bot)})
    return mark_safe(html.strip())  # rendered by a template, escaped there


@lru_cache(maxsize=1024)
def _card(card: tuple[tuple[str, str], ...]) -> SafeString:
    html = _template("chat/_assistant_card.html").render({"c": dict(card)})
    return mark_safe(html.strip())  # rendered by a template, escaped there


@register.simple_tag
def avatar(name: str, picture: str = "", role: str = "") -> SafeString:
    """`role`: "assistant" shows an assistant's (square) avatar."""
    return _avatar(str(name), str(picture), role == "assistant")


@register.simple_tag
def assistant_card(message: Message) -> SafeString:
    return _card(tuple(people.assistant_card(message).items()))  # its fields, hashable: the cache's key
