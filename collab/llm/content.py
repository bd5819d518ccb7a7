"""A chat request's content as the model is sent it: a string, or a list of OpenAI
content parts when a turn carries images (chat/files/for_models.py). What it says, what
it counts toward a budget, and text added to it, whichever it is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

ChatMessage = dict[str, Any]  # as collab.llm.client's

# What an image part counts as, in characters: toward a reply's context budget
# (chat/files/for_models.py) and in the ~4-characters-a-token estimate of a request with
# no usage (an image costs a vision model some hundreds of tokens).
IMAGE_CHARS = 1000


def content_text(content: Any) -> str:
    """A message's text: its content when a string, else its text parts joined (a turn
    with images is a list of OpenAI content parts: chat/files/for_models.py)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def content_chars(message: ChatMessage) -> int:
    """What a message counts as, in characters: its text, and IMAGE_CHARS per image part."""
    content = message.get("content")
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        images = sum(1 for p in content if isinstance(p, dict) and p.get("type") == "image_url")
        return len(content_text(content)) + images * IMAGE_CHARS
    return 0


def prompt_estimate(messages: Sequence[ChatMessage]) -> int:
    """A request's prompt tokens when the provider sent no usage: ~4 characters a token."""
    return sum(content_chars(m) for m in messages) // 4


def with_text(content: Any, extra: str) -> str | list[dict[str, Any]]:
    """`content` with `extra` after its text (a paragraph more): a string stays a string; a
    list of parts gets it in its first text part, its images kept."""
    if isinstance(content, list):
        parts = [dict(p) for p in content]
        for part in parts:
            if part.get("type") == "text":
                part["text"] = f"{part.get('text') or ''}\n\n{extra}"
                return parts
        return [{"type": "text", "text": extra}, *parts]
    return f"{content or ''}\n\n{extra}"
