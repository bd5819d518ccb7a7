"""Files in templates: `{{ attachment|file_label }}`, a file's type as its card says it
(templates/chat/_attachments.html); `{% file_limits as limits %}`, the composer's file
limits (COLLAB["MAX_FILE_BYTES"], ["MAX_MESSAGE_FILES"], ["MAX_MESSAGE_FILE_BYTES"]) for
its data attributes and the line that states them before anyone picks a file
(static/collab/files.js reads the attributes)."""

from __future__ import annotations

from django import template
from django.conf import settings

from collab.chat.file_models import Attachment

register = template.Library()

# Content types (sniffed at upload, never the extension's) people know by another name.
LABELS = {
    "application/pdf": "PDF",
    "text/plain": "Text",
    "text/markdown": "Markdown",
    "text/csv": "CSV",
    "application/json": "JSON",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "Word",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "Excel",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation": "PowerPoint",
    "application/zip": "ZIP",
}


@register.filter
def file_label(attachment: Attachment) -> str:
    """ "PDF", "Word", "CSV"...; else the content type's subtype ("PNG"), else "File"."""
    content_type = attachment.content_type.split(";")[0].strip().lower()
    if content_type in LABELS:
        return LABELS[content_type]
    subtype = content_type.partition("/")[2].removeprefix("x-")
    return subtype.upper()[:12] if subtype.isalnum() else "File"


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
