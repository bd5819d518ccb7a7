"""A room's history pages, for its members: search, a message in context (`?at=SEQ` on
the room's page), the transcript as a download, and the edit form of one's own message.
Reads go through actions.history (visible_to: never another member's personal reply)."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from collab.chat import rendering
from collab.chat import view_access as access
from collab.chat.errors import ClientError
from collab.chat.models import Membership, Message, Room
from collab.chat.services import history


def _member(request: HttpRequest, slug: str) -> tuple[Room, Membership] | HttpResponse:
    """The room and the member's membership; a banned user gets the ban page, anyone else
    (staff who are not members too: these pages are for members) a 404."""
    found = access.viewer_or_ban_page(request, slug)
    if isinstance(found, HttpResponse):
        return found
    the_room, membership = found
    if membership is None:
        raise Http404("No such room, or you are not a member.")
    return the_room, membership


@require_GET
def search(request: HttpRequest, slug: str) -> HttpResponse:
    found = _member(request, slug)
    if isinstance(found, HttpResponse):
        return found
    the_room, membership = found
    raw = request.GET.get("q", "")
    context: dict[str, object] = {"room": the_room, "q": raw[: history.MAX_QUERY_CHARS]}
    try:
        q = history.check_query(raw)
    except ClientError as exc:
        context.update(error_code=exc.code, error=exc.message)
        return render(request, "chat/search.html", context, status=200 if exc.code == "search.empty" else 400)
    page = Paginator(history.search(the_room, membership.user_id, q), history.PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    context.update(
        page=page,
        results=[(m, history.excerpt(m, q)) for m in page.object_list],
    )
    return render(request, "chat/search.html", context)


def context(request: HttpRequest, slug: str) -> HttpResponse:
    """The room's page at one message (`?at=SEQ`): the messages around it, read-only, no
    live socket; the message is marked, and the page links back to the live room."""
    found = _member(request, slug)
    if isinstance(found, HttpResponse):
        return found
    the_room, membership = found
    try:
        seq = int(request.GET.get("at", ""))
    except ValueError:
        return HttpResponse("at must be a message number", status=400)
    messages, more_before, more_after = history.around(the_room, membership.user_id, seq)
    edited = {m.id: m.edited_at for m in messages if m.edited_at is not None}
    articles = [(m, rendering.article(m, limit=rendering.budget("ARTICLE_BYTES"), edited=edited)) for m in messages]
    return render(
        request,
        "chat/context.html",
        {"room": the_room, "seq": seq, "articles": articles, "more_before": more_before, "more_after": more_after},
    )


@require_GET
def export(request: HttpRequest, slug: str, fmt: str) -> HttpResponse | StreamingHttpResponse:
    found = _member(request, slug)
    if isinstance(found, HttpResponse):
        return found
    the_room, membership = found
    now = timezone.now()
    base = request.build_absolute_uri("/").rstrip("/")  # the files' links (history.file_record)
    job = history.Export(the_room, membership.user_id, request.user.get_username(), now, base)
    kind = "application/json" if fmt == "json" else "text/markdown"
    response = StreamingHttpResponse(history.stream(job, fmt), content_type=f"{kind}; charset=utf-8")
    name = f"{the_room.slug}-{now:%Y%m%d-%H%M%S}.{fmt}"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    response["Cache-Control"] = "private, no-store"
    return response


@require_GET
def edit_form(request: HttpRequest, slug: str, message_id: int) -> HttpResponse:
    """The box that replaces one's own message's body to edit it (sent on the socket:
    the "edit" action checks everything again)."""
    found = _member(request, slug)
    if isinstance(found, HttpResponse):
        return found
    the_room, membership = found
    message = Message.objects.filter(
        room=the_room, pk=message_id, role=Message.Role.USER, author_id=membership.user_id, deleted_at__isnull=True
    ).first()
    if message is None:
        raise Http404("No such message of yours in this room.")
    return render(request, "chat/_edit_form.html", {"m": message})
