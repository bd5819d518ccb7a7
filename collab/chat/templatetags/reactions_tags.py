"""`{% reaction_bar m %}`: a message's reaction bar in its article (collab/chat/reactionbar.py)."""

from __future__ import annotations

from django import template
from django.utils.safestring import SafeString, mark_safe

from collab.chat import emojis, reactionbar
from collab.chat.models import Message

register = template.Library()


@register.simple_tag
def reaction_bar(message: Message) -> SafeString:
    return mark_safe(reactionbar.bar(message))  # rendered by a template, escaped there


@register.inclusion_tag("chat/_reaction_picker.html")
def reaction_picker() -> dict[str, object]:
    """The room page's one emoji picker: the quick set, and where the whole set is."""
    return {"quick": [(e, emojis.name_of(e)) for e in emojis.QUICK], "emoji_version": emojis.version()}
