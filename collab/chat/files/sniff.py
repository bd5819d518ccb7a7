"""What an upload is, from its content alone (never its name's extension): the few types
collab accepts, each with the content type it is served as and the extension its name
is given (docs/architecture/files.md, "Intake").

Binary types are known by their magic bytes (`filetype`); a DOCX is a zip that holds a
Word document; anything else must be UTF-8 text without NUL bytes, and is then plain
text, Markdown or CSV (the one thing the extension decides: which of the three). Markup
a browser would run (HTML, SVG, XML) is refused even though it is text: it is never
worth the risk of a browser treating it as a page. A file whose extension claims one
type but whose content is another is taken for what its content is (its name then gets
the right extension), or refused when the content is not allowed.
"""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import dataclass

import filetype

from collab.chat.files.errors import FileRefused

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"

# Allowed by their magic bytes: content type -> (kind, extension).
_BINARY = {
    "image/png": ("image", "png"),
    "image/jpeg": ("image", "jpg"),
    "image/gif": ("image", "gif"),
    "image/webp": ("image", "webp"),
    "application/pdf": ("document", "pdf"),
}
_TEXT_BY_EXTENSION = {"md": "text/markdown", "markdown": "text/markdown", "csv": "text/csv"}
EXTENSIONS = {"text/plain": "txt", "text/markdown": "md", "text/csv": "csv", DOCX: "docx"} | {
    t: ext for t, (_, ext) in _BINARY.items()
}
# Text a browser would treat as a page or a drawing that runs scripts: refused. Leading
# comments are looked past (a Markdown file may start with one; an SVG may hide behind one).
_MARKUP = re.compile(
    rb"\A(?:\xef\xbb\xbf)?(?:\s*<!--.*?-->)*\s*<(?:!doctype\s+(?:html|svg)|html|head|body|script|svg|\?xml|iframe)",
    re.I | re.S,
)


@dataclass(frozen=True)
class Sniffed:
    kind: str  # "image" | "document"
    content_type: str
    extension: str  # without the dot


def refused() -> FileRefused:
    return FileRefused(
        "file.type_refused",
        "This type of file is not accepted: images (PNG, JPEG, GIF, WebP) and documents "
        "(PDF, DOCX, plain text, Markdown, CSV) are.",
    )


def _is_docx(data: bytes) -> bool:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            names = set(zf.namelist())
    except (zipfile.BadZipFile, ValueError, OSError):
        return False
    return "[Content_Types].xml" in names and "word/document.xml" in names


def is_text(data: bytes) -> bool:
    """UTF-8 without NUL bytes (a BOM allowed)."""
    if b"\x00" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def sniff(data: bytes, name: str) -> Sniffed:
    """The type of `data` (the whole upload); `name` only picks among the text flavours.
    Raises file.type_refused for everything not allowed."""
    guess = filetype.guess(data[:8192])
    if guess is not None:
        mime = guess.mime
        if mime in _BINARY:
            kind, ext = _BINARY[mime]
            return Sniffed(kind, mime, ext)
        if mime in ("application/zip", DOCX) and _is_docx(data):
            return Sniffed("document", DOCX, "docx")
        raise refused()
    if data and is_text(data):
        if _MARKUP.match(data[:4096]):
            raise refused()
        ext = name.rsplit(".", 1)[-1].lower() if "." in name else ""
        content_type = _TEXT_BY_EXTENSION.get(ext, "text/plain")
        return Sniffed("document", content_type, EXTENSIONS[content_type])
    raise refused()
