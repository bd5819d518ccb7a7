"""`{% vote_bar m %}`: an assistant reply's vote bar in its article (actions/votes.py)."""

from __future__ import annotations

from django import template
from django.utils.safestring import SafeString, mark_safe

from collab.chat.models import Message

register = template.Library()


@register.simple_tag
def vote_bar(message: Message) -> SafeString:
    from collab.chat.actions import votes  # not at import: rendering compiles templates as it loads

    return mark_safe(votes.bar(message))  # rendered by a template, escaped there
