"""The admin's live page (/admin/chat/room/live/): what runs now, on every process.

Each server process publishes its status in the shared state on its heartbeat
(lifecycle.Runtime.status: its sockets per room and user, the replies it runs with their
provider, model, tokens so far, rate and elapsed time); a status not renewed for
STATUS_TTL_S is gone, so a dead process drops out by itself. The page reads them all,
with this process's own as it is now, and shows per room the open sockets per process,
who is online, the replies streaming and those queued; per process its sockets, replies
and the age of its last beat. It polls its fragment every REFRESH_S (htmx). Its buttons
(stop a reply; close, lock, unlock a room) act through actions.moderation, which checks,
writes the audit row and reaches the process that holds the reply or the sockets.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import async_to_sync
from django.contrib import messages
from django.contrib.admin import AdminSite
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.views.decorators.http import require_GET, require_POST

from collab.chat import shared
from collab.chat.admin.providers import staff_actor
from collab.chat.errors import ClientError
from collab.chat.lifecycle import runtime
from collab.chat.models import Message, Room
from collab.chat.services import moderation

REFRESH_S = 2  # the page asks for its fragment this often (the processes publish every 2 s)


@dataclass
class LiveReply:
    id: int
    room_id: int
    process: str
    provider: str
    model: str
    state: str  # queued | writing
    ahead: int  # its place in its provider's queue (1: next), while queued
    tokens: int
    chars: int
    tps: float
    elapsed_s: float
    assistant: str = ""


@dataclass
class LiveRoom:
    room: Room
    sockets: dict[str, int] = field(default_factory=dict)  # process -> open sockets
    online: list[str] = field(default_factory=list)  # usernames
    watching: int = 0  # staff viewing it read-only (not members, not online)
    replies: list[LiveReply] = field(default_factory=list)

    @property
    def n_sockets(self) -> int:
        return sum(self.sockets.values())

    @property
    def streaming(self) -> list[LiveReply]:
        return [r for r in self.replies if r.state != "queued"]

    @property
    def queued(self) -> list[LiveReply]:
        return [r for r in self.replies if r.state == "queued"]


@dataclass
class LiveProcess:
    id: str
    pid: int
    host: str
    sockets: int
    replies: int
    age_s: float
    draining: bool
    stale: bool
    here: bool  # the process serving this page (its figures are as of now)


@dataclass
class Live:
    rooms: list[LiveRoom]
    processes: list[LiveProcess]
    unavailable: bool = False  # the shared state did not answer: this process alone is shown


async def statuses() -> tuple[list[tuple[dict[str, Any], float]], bool]:
    """(status, age in seconds) of every process, this one's as it is now; and whether the
    shared state failed to answer (then only this process's own)."""
    own: list[tuple[dict[str, Any], float]] = [(runtime.status(), 0.0)]
    try:
        published = await shared.backend().process_statuses()
    except shared.UNAVAILABLE:
        return own, True
    others = []
    for p in published:
        if p.process == shared.PROCESS_ID:
            continue
        try:
            status = json.loads(p.status)
        except ValueError:
            continue
        if isinstance(status, dict):
            others.append((status, p.age_s))
    return own + sorted(others, key=lambda s: str(s[0].get("process", ""))), False


def collect() -> Live:
    """The page's figures: the processes' statuses, with names from the database."""
    found, unavailable = async_to_sync(statuses)()
    sockets: dict[int, dict[str, int]] = {}  # room -> process -> sockets
    online: dict[int, set[int]] = {}  # room -> users
    watching: dict[int, int] = {}  # room -> staff viewing it read-only
    replies: list[LiveReply] = []
    processes = []
    for status, age_s in found:
        process = str(status.get("process", "?"))
        n_sockets = 0
        for room_id, users in dict(status.get("sockets") or {}).items():
            count = sum(int(n) for n in users.values())
            sockets.setdefault(int(room_id), {})[process] = count
            online.setdefault(int(room_id), set()).update(int(u) for u in users)
            n_sockets += count
        for room_id, count in dict(status.get("watchers") or {}).items():
            watching[int(room_id)] = watching.get(int(room_id), 0) + int(count)
        own_replies = list(status.get("replies") or [])
        for r in own_replies:
            replies.append(
                LiveReply(
                    id=int(r["id"]),
                    room_id=int(r["room"]),
                    process=process,
                    provider=str(r.get("provider", "")),
                    model=str(r.get("model", "")),
                    state=str(r.get("state", "writing")),
                    ahead=int(r.get("ahead", 0)),
                    tokens=int(r.get("tokens", 0)),
                    chars=int(r.get("chars", 0)),
                    tps=float(r.get("tps", 0.0)),
                    elapsed_s=float(r.get("elapsed_s", 0.0)) + age_s,  # as of now, not of its beat
                )
            )
        processes.append(
            LiveProcess(
                id=process,
                pid=int(status.get("pid", 0)),
                host=str(status.get("host", "")),
                sockets=n_sockets,
                replies=len(own_replies),
                age_s=age_s,
                draining=bool(status.get("draining")),
                stale=bool(status.get("stale")),
                here=process == shared.PROCESS_ID,
            )
        )
    room_ids = set(sockets) | set(watching) | {r.room_id for r in replies}
    rooms = Room.objects.in_bulk(room_ids)
    names = dict(User.objects.filter(pk__in=set().union(*online.values())).values_list("pk", "username"))
    handles = dict(Message.objects.filter(pk__in=[r.id for r in replies]).values_list("pk", "assistant__handle"))
    live_rooms = {i: LiveRoom(rooms[i]) for i in room_ids if i in rooms}
    for room_id, per_process in sockets.items():
        if room_id in live_rooms:
            live_rooms[room_id].sockets = per_process
            live_rooms[room_id].online = sorted(names[u] for u in online.get(room_id, ()) if u in names)
    for room_id, count in watching.items():
        if room_id in live_rooms:
            live_rooms[room_id].watching = count
    for reply in sorted(replies, key=lambda r: r.id):
        if reply.room_id in live_rooms:
            reply.assistant = handles.get(reply.id) or ""
            live_rooms[reply.room_id].replies.append(reply)
    return Live(sorted(live_rooms.values(), key=lambda r: r.room.slug), processes, unavailable)


# --- the views --------------------------------------------------------------------------------


def _context(site: AdminSite, request: HttpRequest, **extra: Any) -> dict[str, Any]:
    return {
        **site.each_context(request),
        "title": "Live",
        "live": collect(),
        "refresh_s": REFRESH_S,
        "opts": Room._meta,
        **extra,
    }


def _need(request: HttpRequest, perm: str) -> None:
    """Staff with the permission only: seeing the page takes chat.view_room, its buttons
    chat.change_room (as the room list's actions do)."""
    if not request.user.has_perm(perm):
        raise PermissionDenied(f"The live page needs the permission {perm}.")


def _page(site: AdminSite) -> Callable[[HttpRequest], HttpResponse]:
    @require_GET
    def page(request: HttpRequest) -> HttpResponse:
        _need(request, "chat.view_room")
        return TemplateResponse(request, "admin/chat/live.html", _context(site, request))

    return page


def _fragment(site: AdminSite) -> Callable[[HttpRequest], HttpResponse]:
    @require_GET
    def fragment(request: HttpRequest) -> HttpResponse:
        _need(request, "chat.view_room")
        return TemplateResponse(request, "admin/chat/live_fragment.html", _context(site, request))

    return fragment


def _acted(site: AdminSite, request: HttpRequest, done: str, error: ClientError | None) -> HttpResponse:
    """After a button: the fragment again (htmx), or the page (a plain form post)."""
    if request.headers.get("HX-Request"):
        notice = {"notice": error.message if error else done, "notice_code": error.code if error else "ok"}
        return TemplateResponse(request, "admin/chat/live_fragment.html", _context(site, request, **notice))
    if error:
        messages.error(request, error.message)
    else:
        messages.success(request, done)
    return HttpResponseRedirect(reverse("admin:chat_room_live", current_app=site.name))


def _stop(site: AdminSite) -> Callable[[HttpRequest, int], HttpResponse]:
    @require_POST
    def stop(request: HttpRequest, reply_id: int) -> HttpResponse:
        _need(request, "chat.change_room")
        reply = get_object_or_404(Message.objects.select_related("room"), pk=reply_id, role=Message.Role.ASSISTANT)
        try:
            running = moderation.stop_reply(staff_actor(request), reply.room, reply.pk)
        except ClientError as exc:
            return _acted(site, request, "", exc)
        if not running:
            done = f"Reply {reply.pk} in {reply.room.slug}: no process runs it any more; it ends interrupted shortly."
        else:
            done = f"Reply {reply.pk} in {reply.room.slug} stopped."
        return _acted(site, request, done, None)

    return stop


ROOM_ACTIONS: dict[str, tuple[Callable[..., object], str]] = {
    "close": (moderation.close, "closed: every socket got a notice and was closed"),
    "lock": (moderation.lock, "locked"),
    "unlock": (moderation.unlock, "unlocked"),
}


def _room_action(site: AdminSite) -> Callable[[HttpRequest, int, str], HttpResponse]:
    @require_POST
    def act(request: HttpRequest, room_id: int, action: str) -> HttpResponse:
        _need(request, "chat.change_room")
        if action not in ROOM_ACTIONS:
            raise Http404(f"There is no room action {action!r} (close, lock, unlock).")
        room = get_object_or_404(Room, pk=room_id)
        run, done = ROOM_ACTIONS[action]
        try:
            run(staff_actor(request), room)
        except ClientError as exc:
            return _acted(site, request, "", exc)
        return _acted(site, request, f"Room {room.slug} {done}.", None)

    return act


def urls(site: AdminSite) -> list[URLPattern]:
    """Under the room admin (RoomAdmin.get_urls puts these before its own): staff only."""
    return [
        path("live/", site.admin_view(_page(site)), name="chat_room_live"),
        path("live/fragment/", site.admin_view(_fragment(site)), name="chat_room_live_fragment"),
        path("live/stop/<int:reply_id>/", site.admin_view(_stop(site)), name="chat_room_live_stop"),
        path("live/room/<int:room_id>/<slug:action>/", site.admin_view(_room_action(site)), name="chat_room_live_room"),
    ]
