"""A document's text, once, at upload (docs/architecture/files.md, "Extraction").

Plain text, Markdown and CSV are decoded here. A PDF (pypdf) or a DOCX (python-docx)
is read in a child process (`extract_worker`), which the server never shares memory
with: it limits its own address space to COLLAB["EXTRACT_MEMORY_MB"] and is killed
past COLLAB["EXTRACT_BUDGET_S"]; either ends in file.too_complex. A fresh process per
document (about 0.1 s of start-up, plus the library's import) keeps a runaway one from
taking anything else with it; at most CHILDREN run at once per server process (the
others wait, up to the budget, then 503 server.unavailable). The caller runs this on a
thread of its own, never on the event loop. A DOCX is a zip: its declared uncompressed sizes are checked before any
of it is inflated (a zip bomb is refused without opening it).

The text is capped at COLLAB["MAX_EXTRACTED_CHARS"] and cut into parts of about
COLLAB["FILE_PART_CHARS"] at paragraph or line ends (`parts`), each with its page.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass, field

from django.conf import settings

from collab.chat.errors import ClientError
from collab.chat.files.errors import FileRefused, corrupt, too_complex
from collab.chat.files.sniff import DOCX

log = logging.getLogger(__name__)

# Documents read at once by this process's children (the others wait, up to the budget).
CHILDREN = threading.BoundedSemaphore(max(2, os.cpu_count() or 2))

PAGE_SEPARATOR = "\n\n"
# A DOCX inflates to at most this many times the largest upload, and at most this ratio
# of its compressed size once past ZIP_RATIO_FLOOR bytes (Word's own XML inflates ~5-20x).
ZIP_MAX_FACTOR = 10
ZIP_MAX_RATIO = 100
ZIP_RATIO_FLOOR = 10 << 20


@dataclass
class Extracted:
    text: str
    page_starts: list[int] = field(default_factory=lambda: [0])
    extract_ms: int = 0


@dataclass(frozen=True)
class Part:
    n: int
    page: int
    start: int
    text: str


def check_zip(data: bytes) -> None:
    """Refuse a zip whose members would inflate past what any real DOCX needs. The sizes
    are the ones its directory declares; zipfile never inflates a member past its
    declared size, so a lie there only cuts the member short (and fails its CRC)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, ValueError, OSError):
        raise corrupt("the document's zip structure cannot be read") from None
    total = sum(i.file_size for i in infos)
    packed = max(1, sum(i.compress_size for i in infos))
    cap = ZIP_MAX_FACTOR * int(settings.COLLAB["MAX_FILE_BYTES"])
    if total > cap or (total > ZIP_RATIO_FLOOR and total / packed > ZIP_MAX_RATIO):
        raise too_complex(f"it would inflate to {total:,} bytes")


def _joined(pages: list[str], max_chars: int) -> tuple[str, list[int]]:
    text: list[str] = []
    starts: list[int] = []
    length = 0
    for page in pages:
        if length >= max_chars:
            break
        if text:
            text.append(PAGE_SEPARATOR)
            length += len(PAGE_SEPARATOR)
        starts.append(length)
        text.append(page)
        length += len(page)
    return "".join(text)[:max_chars], starts or [0]


def _in_child(data: bytes, content_type: str) -> list[str]:
    budget = float(settings.COLLAB["EXTRACT_BUDGET_S"])
    memory = int(settings.COLLAB["EXTRACT_MEMORY_MB"])
    max_chars = int(settings.COLLAB["MAX_EXTRACTED_CHARS"])
    command = [sys.executable, "-m", "collab.chat.files.extract_worker", content_type, str(memory), str(max_chars)]
    # At most CHILDREN at once per server process: each may take EXTRACT_MEMORY_MB and a core.
    if not CHILDREN.acquire(timeout=budget):
        raise ClientError("server.unavailable", "The server is reading too many documents just now; try again.")
    try:
        done = subprocess.run(
            command, input=data, capture_output=True, timeout=budget, cwd=settings.BASE_DIR, check=False
        )
    except subprocess.TimeoutExpired:  # run() killed it
        raise too_complex(f"reading it takes more than {budget:g} s") from None
    finally:
        CHILDREN.release()
    try:
        result = json.loads(done.stdout)
    except ValueError:
        if done.returncode < 0 or b"MemoryError" in done.stderr:
            # Killed (the kernel, a signal), or out of memory where it could not even answer.
            raise too_complex(f"reading it needs more than {memory} MB") from None
        log.warning("extraction of a %s failed: %s", content_type, done.stderr[-2000:].decode(errors="replace"))
        raise corrupt("it cannot be read") from None
    if "error" in result:
        code, message = result["error"], result["message"]
        if code == "file.too_complex":
            raise too_complex(message)
        if code == "file.corrupt":
            raise corrupt(message)
        raise FileRefused(code, message)
    return [str(p) for p in result["pages"]]


def extract(data: bytes, content_type: str) -> Extracted:
    """The document's text and where its pages start; raises file.corrupt,
    file.encrypted or file.too_complex. Blocking: call it off the event loop."""
    max_chars = int(settings.COLLAB["MAX_EXTRACTED_CHARS"])
    started = time.monotonic()
    if content_type.startswith("text/"):
        pages = [data.decode("utf-8-sig").replace("\r\n", "\n")]
    else:
        if content_type == DOCX:
            check_zip(data)
        pages = _in_child(data, content_type)
    # NUL is refused by PostgreSQL's text; a PDF's text can hold one.
    pages = [p.replace("\x00", "") for p in pages]
    text, starts = _joined(pages, max_chars)
    return Extracted(text, starts, int((time.monotonic() - started) * 1000))


def _cut(text: str, at: int, size: int) -> int:
    """Where a part starting at `at` ends: the last paragraph end in its stretch, else the
    last line end, else a space, else exactly `size` on."""
    end = at + size
    if end >= len(text):
        return len(text)
    for mark in ("\n\n", "\n", " "):
        found = text.rfind(mark, at + size // 2, end)
        if found != -1:
            return found + len(mark)
    return end


def parts(text: str, page_starts: list[int], size: int | None = None) -> list[Part]:
    """The text in parts of about `size` characters (COLLAB["FILE_PART_CHARS"]), each with
    the page it starts on; blank parts are left out, numbers stay consecutive."""
    size = max(100, size or int(settings.COLLAB["FILE_PART_CHARS"]))
    found: list[Part] = []
    at, page = 0, 1
    starts = list(page_starts) or [0]
    while at < len(text):
        end = _cut(text, at, size)
        while page < len(starts) and starts[page] <= at:
            page += 1
        chunk = text[at:end]
        if chunk.strip():
            found.append(Part(len(found), page, at, chunk))
        at = end
    return found
