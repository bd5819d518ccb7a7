"""A posted image by signed link, for a model provider that fetches images by URL
(Provider.image_delivery "url"; docs/architecture/files.md, "What models see").

No login: the token (files/signing.py) is the permission, for one file, for
SIGNED_URL_S. Anything else is a 404 that tells nothing: a forged or expired token, a
file not posted (or its message deleted), a document (only images are linked).

The bytes and their headers are the members' view's (file_views.serve): the same safe
type, `nosniff`, sandboxing CSP and disposition, sent the same way (Django, nginx or S3).
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.http import Http404, HttpRequest
from django.http.response import HttpResponseBase
from django.views.decorators.http import require_GET

from collab.chat import file_views
from collab.chat.file_models import Attachment
from collab.chat.files.signing import signed_id


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
    return file_views.serve(attachment, attachment.file.name, attachment.content_type, attachment.name, False)
