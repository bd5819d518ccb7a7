"""A reply's versions in one place (docs/wire.md, "regenerate a reply"): the article of one
version of a slot, made to replace whichever version of that slot a page shows. Every
reply's article carries its slot's id (`data-slot`, the id of the slot's first reply), so
the swap finds it by that id and the article keeps its place in the list."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from collab.chat import rendering
from collab.chat.models import Message


def slot_id(message: Message) -> int:
    """The id of the reply's slot: its first version's id (its own, for a first version)."""
    return message.version_of_id or message.id


def slot_of(root_id: int) -> QuerySet[Message]:
    """Every version of the slot whose first version is `root_id`, first to last."""
    return Message.objects.filter(Q(pk=root_id) | Q(version_of_id=root_id)).order_by("version")


def in_place(message: Message) -> str:
    """The version's article (cut over a frame's budget, as a "new" or "final" one),
    swapped in for the article of its slot the page shows (htmx's out-of-band swap by a
    selector: no other element carries `data-slot`)."""
    html = rendering.article(message, limit=rendering.budget("FRAME_ARTICLE_BYTES")).strip()
    assert html.startswith("<article ")
    swap = f"hx-swap-oob=\"outerHTML:article[data-slot='{slot_id(message)}']\""
    return f"<article {swap} {html.removeprefix('<article ')}"
