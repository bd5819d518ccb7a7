"""Files over HTTP (docs/wire.md, "Files"): upload, and serving to the room's members.

`upload` takes one file per request (multipart field `file`) from a member of an open
room, within their upload rate, and answers 201 with its description; the post that
names its id attaches it (commands/posting.py). `download` and `thumb` serve a file to
the members who may see its message (the uploader alone until it is posted), and to
staff who view the room read-only (they see its messages, so its files too); everyone
else gets the same 404 as for a room or a file that does not exist. The answers carry a
content type of ours (never the member's), `nosniff`, a Content-Disposition (inline
only for images and PDF) and a sandboxing CSP: a file can never act as a page of this
site. Bytes are sent by Django (FileResponse), by nginx (`X-Accel-Redirect` when
COLLAB_FILES_ACCEL is set) or by the S3 store itself (a presigned URL that expires in
COLLAB_FILES_URL_EXPIRE_S); docs/architecture/files.md says when to use which.
"""

from __future__ import annotations

import math
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.http.response import HttpResponseBase
from django.utils.cache import patch_cache_control
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_GET, require_POST

from collab.chat import shared
from collab.chat import view_access as access
from collab.chat.errors import ClientError
from collab.chat.file_models import Attachment
from collab.chat.files import handlers, uploads
from collab.chat.files.errors import STATUS, FileRefused
from collab.chat.files.sniff import DOCX
from collab.chat.models import Membership, Message
from collab.chat.services import rooms as room_actions

NOT_FOUND = "No such file, or you may not see it."
# Served inline (a browser shows them itself); everything else is a download.
_INLINE = {"image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf"}
# What each stored type is served as: text of any flavour as plain UTF-8 text.
_SERVED_AS = {"text/plain": "text/plain; charset=utf-8", "text/markdown": "text/plain; charset=utf-8"} | {
    "text/csv": "text/plain; charset=utf-8",
    DOCX: DOCX,
}
# Nothing in a served file may run, load or frame anything. A PDF is the exception to
# `sandbox`: Chromium refuses to start its PDF viewer in a sandboxed document.
_CSP = "default-src 'none'; style-src 'unsafe-inline'; sandbox"
_CSP_PDF = "default-src 'none'; style-src 'unsafe-inline'; object-src 'self'"  # the viewer is an <embed>


def _error(code: str, message: str, status: int, retry_after: float | None = None) -> JsonResponse:
    response = JsonResponse({"error": {"code": code, "message": message}}, status=status)
    if retry_after is not None:
        response["Retry-After"] = str(max(1, math.ceil(retry_after)))
    return response


def describe(attachment: Attachment) -> dict[str, Any]:
    """The upload's answer (docs/wire.md, "Files")."""
    image = attachment.is_image
    return {
        "id": attachment.pk,
        "name": attachment.name,
        "kind": attachment.kind,
        "content_type": attachment.content_type,
        "size": attachment.size,
        "url": attachment.get_absolute_url(),
        "thumb_url": attachment.thumb_url() if image and attachment.thumb else None,
        "width": attachment.width,
        "height": attachment.height,
        "pages": None if image else attachment.pages,
        "extract_ms": None if image else attachment.extract_ms,
    }


async def _take_upload_token(user_id: int) -> None:
    """The member's upload rate, over all their rooms and every server process: a
    burst of COLLAB["UPLOAD_BURST"], then one per COLLAB["UPLOAD_REFILL_S"]."""
    burst, refill = float(settings.COLLAB["UPLOAD_BURST"]), float(settings.COLLAB["UPLOAD_REFILL_S"])
    try:
        taken = await shared.backend().take(f"upload:{user_id}", burst, refill)
    except shared.UNAVAILABLE:
        raise ClientError(
            "server.unavailable", "The server cannot reach its shared state just now; try again."
        ) from None
    if not taken:
        raise FileRefused("file.rate", "You are uploading files too fast; wait a moment.")


@require_POST
def upload(request: HttpRequest, slug: str) -> HttpResponse:
    me = access.user(request)
    membership = Membership.objects.select_related("room").filter(room__slug=slug, user_id=me.pk).first()
    if membership is None:  # the same answer for "no such room": which rooms exist is nobody's business
        return _error("room.forbidden", "No such room, or you are not a member.", 404)
    try:
        room_actions.check_open(membership.room)
        async_to_sync(_take_upload_token)(me.pk)
        uploaded = request.FILES.get("file")  # parsed here, or already by the CSRF check
        if getattr(request, handlers.MARK, False):
            raise uploads.too_large()
        if uploaded is None:
            raise FileRefused("file.missing", "Send one file in the form field `file`.")
        attachment = uploads.intake(membership.room, me, uploaded)
    except ClientError as exc:
        retry = float(settings.COLLAB["UPLOAD_REFILL_S"]) if exc.code == "file.rate" else None
        return _error(exc.code, exc.message, STATUS.get(exc.code, 400), retry)
    return JsonResponse(describe(attachment), status=201)


def _visible(request: HttpRequest, slug: str, file_id: int) -> Attachment | None:
    """The file, when this user may see it: a member of its room, and its message one they
    see (not deleted; a personal message only for its people), or their own upload not
    posted yet."""
    me = access.user(request)
    attachment = Attachment.objects.select_related("room").filter(pk=file_id, room__slug=slug).first()
    if attachment is None:
        return None
    try:  # a member, or staff who view the room read-only (view_access.viewer)
        _room, membership = access.viewer(request, slug)
    except Http404:
        return None
    if attachment.message_id is None:
        if membership is None:
            return None
        return attachment if attachment.uploader_id == me.pk else None
    seen = Message.objects.visible_to(me.pk).filter(pk=attachment.message_id, deleted_at__isnull=True).exists()
    return attachment if seen else None


def serve(attachment: Attachment, name: str, content_type: str, filename: str, as_attachment: bool) -> HttpResponseBase:
    disposition = content_disposition_header(as_attachment, filename) or "attachment"
    accel = settings.COLLAB_FILES_ACCEL
    response: HttpResponseBase
    if accel:
        # nginx sends the bytes (an internal location: deploy/nginx.conf); it keeps these
        # headers of ours, and adds nosniff and the CSP itself.
        response = HttpResponse(content_type=content_type)
        response["X-Accel-Redirect"] = accel.rstrip("/") + "/" + name
    elif settings.COLLAB_S3_BUCKET:
        # The store sends the bytes, to whoever holds this URL for its few seconds: the
        # membership was checked just now, and the type and disposition are ours.
        url = attachment.file.storage.url(
            name,
            parameters={"ResponseContentType": content_type, "ResponseContentDisposition": disposition},
            expire=settings.COLLAB_FILES_URL_EXPIRE_S,
        )
        response = HttpResponseRedirect(url)
    else:
        response = FileResponse(attachment.file.storage.open(name, "rb"), content_type=content_type)
    response["Content-Disposition"] = disposition
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = _CSP_PDF if content_type == "application/pdf" else _CSP
    patch_cache_control(response, private=True, max_age=0 if isinstance(response, HttpResponseRedirect) else 3600)
    return response


@require_GET
def download(request: HttpRequest, slug: str, file_id: int, name: str) -> HttpResponseBase:
    attachment = _visible(request, slug, file_id)
    if attachment is None or name != attachment.name:
        return _error("file.not_found", NOT_FOUND, 404)
    served = _SERVED_AS.get(attachment.content_type, attachment.content_type)
    return serve(attachment, attachment.file.name, served, attachment.name, attachment.content_type not in _INLINE)


@require_GET
def thumb(request: HttpRequest, slug: str, file_id: int) -> HttpResponseBase:
    attachment = _visible(request, slug, file_id)
    if attachment is None or not attachment.is_image:
        return _error("file.not_found", NOT_FOUND, 404)
    if not attachment.thumb:  # none made (an image stored before they were): the image itself
        return serve(attachment, attachment.file.name, attachment.content_type, attachment.name, False)
    filename = attachment.name.rsplit(".", 1)[0] + "-thumb.webp"
    return serve(attachment, attachment.thumb.name, "image/webp", filename, False)
