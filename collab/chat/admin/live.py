"""(being written)"""

from __future__ import annotations

from django.contrib.admin import AdminSite
from django.urls import URLPattern


def urls(site: AdminSite) -> list[URLPattern]:
    return []
