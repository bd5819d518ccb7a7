"""`python -m collab.chat.files.extract_worker CONTENT_TYPE MEMORY_MB MAX_CHARS`: a
document's text, in a process of its own (collab/chat/files/extract.py starts it).

The document comes on stdin; one JSON object goes to stdout: {"pages": [text, ...]} or
{"error": code, "message": sentence}. The process limits its own address space
(RLIMIT_AS) before it reads anything, so a document that inflates past MEMORY_MB ends
in a MemoryError here (or the kernel's refusal), never in the server; the parent kills
it past its time budget. It imports no Django (it starts in about a tenth of a second
plus the library's import) and only the one library the type needs.
"""

from __future__ import annotations

import io
import json
import resource
import sys
from typing import Any

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


def _pdf(data: bytes, max_chars: int) -> dict[str, Any]:
    from pypdf import PasswordType, PdfReader
    from pypdf.errors import DependencyError, FileNotDecryptedError, LimitReachedError, PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        # An owner password only (printing, copying restrictions) opens with "": read.
        # A user password is needed to read it at all: refused, never guessed.
        if reader.is_encrypted and reader.decrypt("") == PasswordType.NOT_DECRYPTED:
            return {"error": "file.encrypted", "message": "This PDF needs a password to open."}
        pages: list[str] = []
        total = 0
        for page in reader.pages:
            text = page.extract_text() or ""
            pages.append(text)
            total += len(text)
            if total >= max_chars:
                break
        return {"pages": pages}
    except (FileNotDecryptedError, DependencyError):
        return {"error": "file.encrypted", "message": "This PDF is encrypted in a way that cannot be opened."}
    except LimitReachedError:
        return {"error": "file.too_complex", "message": "a stream inflates past the reader's limit"}
    except (PdfReadError, ValueError, KeyError, TypeError, IndexError, AttributeError, AssertionError) as exc:
        return {"error": "file.corrupt", "message": f"the PDF cannot be read ({exc.__class__.__name__})"}


def _docx(data: bytes, max_chars: int) -> dict[str, Any]:
    import zipfile

    import docx
    from docx.table import Table

    try:
        document = docx.Document(io.BytesIO(data))
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as exc:
        return {"error": "file.corrupt", "message": f"the document cannot be read ({exc.__class__.__name__})"}
    except Exception as exc:  # lxml's XMLSyntaxError and python-docx's own: a damaged document
        return {"error": "file.corrupt", "message": f"the document cannot be read ({exc.__class__.__name__})"}
    lines: list[str] = []
    total = 0
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            text = "\n".join(" | ".join(cell.text for cell in row.cells) for row in block.rows)
        else:
            text = block.text
        lines.append(text)
        total += len(text) + 1
        if total >= max_chars:
            break
    return {"pages": ["\n".join(lines)]}


def main(argv: list[str]) -> int:
    content_type, memory_mb, max_chars = argv[0], int(argv[1]), int(argv[2])
    limit = memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    data = sys.stdin.buffer.read()
    try:
        if content_type == "application/pdf":
            result = _pdf(data, max_chars)
        elif content_type == DOCX:
            result = _docx(data, max_chars)
        else:
            result = {"error": "file.type_refused", "message": f"no extractor for {content_type}"}
    except MemoryError:
        result = {"error": "file.too_complex", "message": f"its text needs more than {memory_mb} MB to extract"}
    except RecursionError:
        result = {"error": "file.too_complex", "message": "it nests too deeply"}
    except Exception as exc:  # whatever else a damaged document makes a library raise
        result = {"error": "file.corrupt", "message": f"it cannot be read ({exc.__class__.__name__})"}
    sys.stdout.write(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
