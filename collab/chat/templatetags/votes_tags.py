"""`{% vote_bar m %}`: an assistant reply's vote bar in its article (collab/chat/votebar.py)."""

from __future__ import annotations

from django import template
from django.utils.safestring import SafeString, mark_safe

from collab.chat import votebar
from collab.chat.models import Message

register = template.Library()


@register.simple_tag
def vote_bar(message: Message) -> SafeString:
    return mark_safe(votebar.bar(message))  # rendered by a template, escaped there
