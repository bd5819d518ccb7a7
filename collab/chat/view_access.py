"""Who a page is for: the signed-in user, their membership of a room, or staff who view it
read-only; the 404, ban and refusal pages for everyone else. Shared by every view module."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from collab.chat.models import Membership, Room
from collab.chat.services import rooms as room_actions


def user(request: HttpRequest) -> User:
    assert isinstance(request.user, User)  # LoginRequiredMiddleware ran first
    return request.user


def membership(request: HttpRequest, slug: str) -> Membership:
    membership = Membership.objects.select_related("room").filter(room__slug=slug, user_id=user(request).pk).first()
    if membership is None:
        # Same answer for "no such room" and "not yours": slugs are not secrets, but
        # which rooms exist is nobody else's business.
        raise Http404("No such room, or you are not a member.")
    return membership


def viewer(request: HttpRequest, slug: str) -> tuple[Room, Membership | None]:
    """The room and the user's membership in it; staff who are not members get no
    membership: they see the room read-only. Anyone else gets a 404."""
    membership = Membership.objects.select_related("room").filter(room__slug=slug, user_id=user(request).pk).first()
    if membership is not None:
        return membership.room, membership
    staff = room_actions.is_staff(user(request))  # read-only, unless banned from it (the ban page, then)
    the_room = Room.objects.filter(slug=slug).exclude(bans__user=user(request)).first() if staff else None
    if the_room is None:
        raise Http404("No such room, or you are not a member.")
    return the_room, None


def banned_page(request: HttpRequest, the_room: Room) -> HttpResponse:
    owner = the_room.owner.get_username() if the_room.owner_id else ""
    return render(request, "chat/banned.html", {"room": the_room, "owner": owner}, status=403)


def viewer_or_ban_page(request: HttpRequest, slug: str) -> tuple[Room, Membership | None] | HttpResponse:
    """`viewer`, or the page that says so to a user banned from the room (staff too)."""
    try:
        return viewer(request, slug)
    except Http404:
        banned = Room.objects.filter(slug=slug, bans__user_id=user(request).pk).first()
        if banned is not None:
            return banned_page(request, banned)
        raise


def refused(request: HttpRequest, heading: str, text: str, back: str = "") -> HttpResponse:
    return render(request, "chat/refused.html", {"heading": heading, "text": text, "back": back}, status=403)
