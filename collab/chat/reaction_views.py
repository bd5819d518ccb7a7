"""The emoji picker's list (static/collab/reactions.js): the Unicode emoji set as the `emoji`
package knows it (collab/chat/emojis.py), built once per process, the same for everyone
(so open to anyone, and cached by browsers: its URL carries the library's version)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse
from django.utils.cache import patch_cache_control
from django.views.decorators.http import require_GET

from collab.chat import emojis


@login_not_required
@require_GET
def emoji_catalogue(request: HttpRequest) -> HttpResponse:
    response = HttpResponse(emojis.catalogue_json(), content_type="application/json")
    patch_cache_control(response, public=True, max_age=7 * 24 * 3600)
    return response
