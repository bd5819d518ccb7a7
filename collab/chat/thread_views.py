"""A thread's panel (docs/wire.md, "threads"): `GET /r/<slug>/t/<id>/`, loaded by htmx
beside the room (static/collab/threads.js). Members only: anyone else gets a 404, as for
a message of another room, a message in a thread, or one the member does not see."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from collab.chat import rendering
from collab.chat import view_access as access
from collab.chat.models import Room
from collab.chat.services import threads


@require_GET
def thread(request: HttpRequest, slug: str, message_id: int) -> HttpResponse:
    membership = access.membership(request, slug)
    user_id = access.user(request).pk
    parent = threads.parent_for_view(membership.room, user_id, message_id)
    if parent is None:
        raise Http404("No such message in this room.")
    limit = rendering.budget("ARTICLE_BYTES")
    messages, earlier = threads.thread_messages(parent, user_id)
    context = {
        "parent": parent,
        "articles": [rendering.article(m, limit=limit) for m in messages],
        "earlier": earlier,
        "slug": slug,
        "may_post": membership.room.status == Room.Status.OPEN and parent.deleted_at is None,
    }
    return render(request, "chat/_thread_panel.html", context)
