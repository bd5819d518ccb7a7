"""A posted image by signed link, for a model provider that fetches images by URL
(Provider.image_delivery "url"; docs/architecture/files.md, "What models see").

No login: the token (files/signing.py) is the permission, for one file, for
SIGNED_URL_S. Anything else is a 404 that tells nothing: a forged or expired token, a
file not posted (or its message deleted), a document (only images are linked).

`serve_attachment` writes the safe headers the members' view (file_views.py) uses:
a content type from the sniffed ones images may have, `nosniff`, a sandboxing CSP, and
`Content-Disposition` with the member's file name.
"""

from __future__ import annotations

from urllib.parse import quote

from django.contrib.auth.decorators import login_not_required
from django.http import FileResponse, Http404, HttpRequest
from django.http.response import HttpResponseBase
from django.views.decorators.http import require_GET

from collab.chat.file_models import Attachment
from collab.chat.files.signing import SIGNED_URL_S, signed_id

# What a stored image may be served as: anything else goes as bytes to download.
INLINE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


def serve_attachment(attachment: Attachment, thumb: bool = False, max_age: int = 0) -> HttpResponseBase:
    """The file's bytes with safe headers (`thumb`: its thumbnail); never SVG or HTML inline."""
    stored = attachment.thumb if thumb and attachment.thumb else attachment.file
    try:
        handle = stored.open("rb")
    except OSError:  # its bytes are gone (removed with its row's deletion meanwhile)
        raise Http404 from None
    inline = attachment.content_type in INLINE_TYPES
    response = FileResponse(handle, content_type=attachment.content_type if inline else "application/octet-stream")
    disposition = "inline" if inline else "attachment"
    response["Content-Disposition"] = f"{disposition}; filename*=UTF-8''{quote(attachment.name)}"
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response["Cache-Control"] = f"private, max-age={max_age}" if max_age else "private, no-cache"
    return response


@login_not_required  # the token is the permission: a provider has no session
@require_GET
def signed(request: HttpRequest, token: str) -> HttpResponseBase:
    attachment_id = signed_id(token)
    if attachment_id is None:
        raise Http404
    attachment = (
        Attachment.objects.filter(
            pk=attachment_id,
            kind=Attachment.Kind.IMAGE,
            message__isnull=False,
            message__deleted_at__isnull=True,
            message__recipient__isnull=True,  # a personal message's file is never linked
        )
        .only("id", "name", "content_type", "file", "thumb")
        .first()
    )
    if attachment is None:
        raise Http404
    return serve_attachment(attachment, max_age=SIGNED_URL_S)
