"""`{% file_limits as limits %}`: the composer's file limits (COLLAB["MAX_FILE_BYTES"],
["MAX_MESSAGE_FILES"], ["MAX_MESSAGE_FILE_BYTES"]), for its data attributes and the line
that states them before anyone picks a file (static/collab/files.js reads the attributes)."""

from __future__ import annotations

from django import template
from django.conf import settings

register = template.Library()


def megabytes(n: int) -> str:
    """20971520 -> "20 MB"; 1572864 -> "1.5 MB" (MiB, as the page shows sizes)."""
    mb = n / (1 << 20)
    return f"{mb:.0f} MB" if mb >= 10 or mb == int(mb) else f"{mb:.1f} MB"


@register.simple_tag
def file_limits() -> dict[str, object]:
    files, each, total = (
        settings.COLLAB["MAX_MESSAGE_FILES"],
        settings.COLLAB["MAX_FILE_BYTES"],
        settings.COLLAB["MAX_MESSAGE_FILE_BYTES"],
    )
    text = f"Up to {files} file{'s' if files != 1 else ''}, {megabytes(each)} each, {megabytes(total)} in all."
    return {"files": files, "file_bytes": each, "message_bytes": total, "text": text}
