"""`{% avatar name %}` and `{% assistant_card m %}` (collab/chat/people.py): avatars beside
every message and member, and the card behind an assistant's name on its reply."""

from __future__ import annotations

from functools import cache
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


@register.simple_tag
def avatar(name: str, picture: str = "", role: str = "") -> SafeString:
    """`role`: "assistant" shows an assistant's (square) avatar."""
    html = _template("chat/_avatar.html").render({"a": people.avatar(str(name), picture, role == "assistant")})
    return mark_safe(html.strip())  # rendered by a template, escaped there


@register.simple_tag
def assistant_card(message: Message) -> SafeString:
    html = _template("chat/_assistant_card.html").render({"c": people.assistant_card(message)})
    return mark_safe(html.strip())  # rendered by a template, escaped there
