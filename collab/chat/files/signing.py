"""Signed links to a posted image, for a provider that fetches images by URL
(Provider.image_delivery "url"; docs/architecture/files.md, "What models see"): the
link needs no login, names the file by a signed token, and expires after SIGNED_URL_S.
Served by collab/chat/file_signed_views.py."""

from __future__ import annotations

from django.conf import settings
from django.core import signing
from django.urls import reverse

SIGNED_URL_S = 600  # long enough for a provider to fetch it while the reply starts
_SALT = "collab.files.signed"


def public_base() -> str:
    """COLLAB_PUBLIC_URL: this server as the providers reach it ("" when not set)."""
    return str(getattr(settings, "COLLAB_PUBLIC_URL", "") or "").rstrip("/")


def signed_url(attachment_id: int) -> str:
    """An absolute link to the file, good for SIGNED_URL_S (public_base() must be set)."""
    token = signing.TimestampSigner(salt=_SALT).sign(str(attachment_id))
    return public_base() + reverse("file_signed", args=[token])


def signed_id(token: str) -> int | None:
    """The attachment a token names, if it is ours and not expired; else None."""
    try:
        value = signing.TimestampSigner(salt=_SALT).unsign(token, max_age=SIGNED_URL_S)
    except signing.BadSignature:  # SignatureExpired is one
        return None
    return int(value) if value.isdigit() else None
