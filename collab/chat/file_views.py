"""Files over HTTP (docs/wire.md, "Files"): upload, and serving to the room's members.
SCAFFOLD: being written (issue 36)."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse


def upload(request: HttpRequest, slug: str) -> HttpResponse:
    raise Http404


def thumb(request: HttpRequest, slug: str, file_id: int) -> HttpResponse:
    raise Http404


def download(request: HttpRequest, slug: str, file_id: int, name: str) -> HttpResponse:
    raise Http404
