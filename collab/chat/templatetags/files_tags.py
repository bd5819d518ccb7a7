"""`{{ attachment|file_label }}`: a file's type as its card says it (templates/chat/_attachments.html)."""

from __future__ import annotations

from django import template

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
