"""What a model is sent of the files in a reply's history (docs/architecture/files.md,
"What models see").

    jobs.reply_jobs ─> read_files(history, budget)   once per post, for all its replies: the
                       history's attachments in one query, by message id; none at all when
                       no message of it has files (HistoryRow.files: most posts); one more
                       query per long document, its parts ranked against the question
                    ─> context.build_context(..., files)   per assistant: Attaching.content

Images go to an assistant that sees them (Assistant.vision, never the embedded local
model) as OpenAI `image_url` parts: a base64 data URL of the stored (re-encoded) image,
or a signed link (Provider.image_delivery); the newest IMAGE_PARTS only, each counting
IMAGE_CHARS toward the budget. Any other image is a note in the turn that says so, never
dropped silently. A document's text goes whole when it fits its share of the budget,
else its parts that match the question (ranking.py), the turn saying which pages.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db.models import Case, F, TextField, Value, When
from django.db.models.functions import Length

from collab.chat.file_models import Attachment, AttachmentPart
from collab.chat.files import ranking
from collab.chat.files.signing import public_base, signed_url
from collab.llm.content import IMAGE_CHARS

if TYPE_CHECKING:
    from collab.chat.context import Said
    from collab.chat.models import Assistant

log = logging.getLogger(__name__)

IMAGE_PARTS = 4  # images sent as parts, the newest; older ones are notes
IMAGE_DATA_BYTES = 4 << 20  # a stored image larger than this goes as its thumbnail (else a note)
DOCUMENT_SHARE = 2  # documents take at most 1/DOCUMENT_SHARE of a context's budget
RANKED_DOCUMENTS = 3  # long documents whose parts are ranked, the newest; older: a note
MIN_PART_CHARS = 200  # less room than this left for a document: a note instead of a stub
DATA_CACHE_BYTES = 32 << 20  # data URLs kept in this process, the most recently sent

_FIELDS = ("id", "message_id", "name", "kind", "content_type", "size", "file", "thumb", "width", "height")
_MAGIC = ((b"\x89PNG", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"))


@dataclass(frozen=True)
class Part:
    n: int
    page: int
    text: str


@dataclass
class FileInfo:
    """An attachment as a context reads it: never its whole text unless it is short."""

    id: int
    message_id: int
    name: str
    kind: str
    content_type: str
    size: int
    file: str
    thumb: str
    width: int | None
    height: int | None
    pages: int
    chars: int  # its text's length
    whole: str  # its text, when short enough to be sent whole ("" otherwise)
    parts: list[Part] = field(default_factory=list)  # a long one's: best match first
    matched: bool = False  # `parts` match the question (else they are its beginning)

    @property
    def is_image(self) -> bool:
        return self.kind == Attachment.Kind.IMAGE

    def describe(self) -> str:
        """Name, type, size and (an image) its pixels: what a note or read_file says of it."""
        pixels = f", {self.width}x{self.height}" if self.width and self.height else ""
        return f"{self.name}, {self.content_type}, {human_size(self.size)}{pixels}"


@dataclass
class HistoryFiles:
    """The files of a reply's history, by message id, and the question they were ranked for."""

    by_message: dict[int, list[FileInfo]]
    question: str = ""
    _urls: dict[tuple[int, str], str | None] = field(default_factory=dict)  # (file id, delivery): its image URL

    def of(self, message_id: int) -> list[FileInfo]:
        return self.by_message.get(message_id, [])

    def image_url(self, info: FileInfo, delivery: str) -> str | None:
        """The image as a part's URL (None: it cannot be sent), made once per post."""
        if delivery == "url" and not public_base():
            delivery = "data"  # no public address to link to: the bytes themselves
        key = (info.id, delivery)
        if key not in self._urls:
            self._urls[key] = signed_url(info.id) if delivery == "url" else _data_url(info)
        return self._urls[key]


NO_FILES = HistoryFiles({})


def human_size(size: int) -> str:
    if size < 1024:
        return f"{size} bytes"
    if size < 1024 * 1024:
        return f"{size / 1024:.0f} KB"
    return f"{size / (1024 * 1024):.1f} MB"


def read_files(history: Sequence[Said], budgets: Sequence[int]) -> HistoryFiles:
    """The files of `history`'s messages (oldest first, the question last), for contexts of
    `budgets` characters (one per reply). No query when none of its messages has files."""
    ids = [m.id for m in history if m.files]
    if not ids:
        return NO_FILES
    question = next((m.text for m in reversed(history) if m.role == "user"), "")
    share = max(budgets, default=0) // DOCUMENT_SHARE  # a text sent whole to the largest context
    smallest = min(budgets, default=0) // DOCUMENT_SHARE  # longer: its parts are ranked, for the smallest
    rows = (
        Attachment.objects.filter(message_id__in=ids)
        .annotate(chars=Length("text"))
        # A short text comes with the row; a long one stays in the database (its parts are ranked).
        .annotate(whole=Case(When(chars__lte=share, then=F("text")), default=Value(""), output_field=TextField()))
        .order_by("message_id", "position", "id")
        .values_list(*_FIELDS, "page_starts", "chars", "whole")
    )
    by_message: dict[int, list[FileInfo]] = {}
    for pk, message_id, name, kind, content_type, size, file, thumb, width, height, page_starts, chars, whole in rows:
        pages = max(1, len(page_starts or []))
        info = FileInfo(
            pk, message_id, name, kind, content_type, size, file, thumb, width, height, pages, chars or 0, whole or ""
        )
        by_message.setdefault(info.message_id, []).append(info)
    order = {message_id: i for i, message_id in enumerate(ids)}
    long = [f for files in by_message.values() for f in files if not f.is_image and f.chars > smallest]
    long.sort(key=lambda f: order.get(f.message_id, 0), reverse=True)  # the newest first
    wanted = share // max(1, settings.COLLAB["FILE_PART_CHARS"]) + 2
    for info in long[:RANKED_DOCUMENTS]:
        parts = AttachmentPart.objects.filter(attachment_id=info.id)
        found = ranking.rank_parts(parts, question, wanted)
        info.matched = bool(found)
        if not found:  # nothing matches: its beginning
            found = list(parts.order_by("n")[:wanted])
        info.parts = [Part(p.n, p.page, p.text) for p in found]
    return HistoryFiles(by_message, question)


class Attaching:
    """One context's files, turn by turn from the newest: how many image parts are left
    and how much of the budget documents may still take."""

    def __init__(self, assistant: Assistant, budget_chars: int, files: HistoryFiles) -> None:
        self.files = files
        self.sees = assistant.vision and not assistant.is_embedded_model
        self.delivery = assistant.provider.image_delivery
        self.images_left = min(IMAGE_PARTS, budget_chars // DOCUMENT_SHARE // IMAGE_CHARS)
        self.documents_left = budget_chars // DOCUMENT_SHARE

    def content(self, said: str, attached: Sequence[FileInfo]) -> tuple[str | list[dict[str, Any]], int]:
        """A turn's content (a string, or text and image parts) and what it costs of the budget."""
        notes: list[str] = []
        images: list[dict[str, Any]] = []
        for info in attached:
            if info.is_image:
                notes.append(self._image(info, images))
            else:
                notes.append(self._document(info))
        text = "\n\n".join([said.rstrip(), *notes])
        if not images:
            return text, len(text)
        return [{"type": "text", "text": text}, *images], len(text) + IMAGE_CHARS * len(images)

    def _image(self, info: FileInfo, images: list[dict[str, Any]]) -> str:
        if not self.sees:
            return f"[image attached: {info.describe()} — you cannot see images]"
        if self.images_left <= 0:
            return f"[image attached: {info.describe()} — not shown: only the newest {IMAGE_PARTS} images are sent]"
        url = self.files.image_url(info, self.delivery)
        if url is None:
            return f"[image attached: {info.describe()} — it could not be sent]"
        self.images_left -= 1
        images.append({"type": "image_url", "image_url": {"url": url}})
        return f"[image {len(images)} attached: {info.describe()}]"

    def _document(self, info: FileInfo) -> str:
        head = f"[file {info.name}: {info.content_type}, {info.pages} page{'s' if info.pages != 1 else ''}"
        if info.chars == 0:
            return f"{head} — no text could be read from it]"
        if info.whole and info.chars <= self.documents_left:
            self.documents_left -= info.chars
            return f"{head}, whole]\n{info.whole}\n[end of file {info.name}]"
        chosen: list[Part] = []
        for part in info.parts:  # best first, while they fit
            room = self.documents_left - sum(len(p.text) for p in chosen)
            if len(part.text) <= room:
                chosen.append(part)
            elif not chosen and room >= MIN_PART_CHARS:
                chosen.append(Part(part.n, part.page, part.text[:room]))
        if not chosen:
            return f"{head}, {info.chars:,} characters — too long to include here (file id {info.id})]"
        self.documents_left -= sum(len(p.text) for p in chosen)
        chosen.sort(key=lambda p: p.n)
        pages = ", ".join(dict.fromkeys(str(p.page) for p in chosen))
        which = "the parts that match the question" if info.matched else "its beginning (no part matches the question)"
        body = "\n".join(f"[page {p.page}]\n{p.text}" for p in chosen)
        return f"{head}; {which}: pages {pages} of {info.pages} (file id {info.id})]\n{body}\n[end of file {info.name}]"


def cut_front(content: str | list[dict[str, Any]], budget_chars: int) -> str | list[dict[str, Any]]:
    """The end of a turn too long for the whole budget (its images kept, their cost counted)."""
    if isinstance(content, str):
        return content[-budget_chars:]
    images = [p for p in content if p.get("type") == "image_url"]
    text = "".join(p["text"] for p in content if p.get("type") == "text")
    room = max(0, budget_chars - IMAGE_CHARS * len(images))
    return [{"type": "text", "text": text[-room:] if room else ""}, *images]


class _DataCache:
    """The data URLs of images sent lately, by stored name (a random one per upload, never
    reused), up to DATA_CACHE_BYTES: a room's
    recent images go with every reply while they are in its history, and a stored image
    never changes, so each is read from storage (perhaps a bucket, from the database
    thread) once while it is in use, not once a post."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.urls: OrderedDict[str, str] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: str) -> str | None:
        with self.lock:
            url = self.urls.get(key)
            if url is not None:
                self.urls.move_to_end(key)
            return url

    def put(self, key: str, url: str) -> None:
        with self.lock:
            if key in self.urls or len(url) > self.limit:
                return
            self.urls[key] = url
            self.size += len(url)
            while self.size > self.limit:
                _, dropped = self.urls.popitem(last=False)
                self.size -= len(dropped)


_data_cache = _DataCache(DATA_CACHE_BYTES)


def _data_url(info: FileInfo) -> str | None:
    """The stored image (or, when larger than IMAGE_DATA_BYTES, its thumbnail) as a data URL."""
    name = info.file if info.size <= IMAGE_DATA_BYTES else info.thumb
    if not name:
        return None
    cached = _data_cache.get(name)
    if cached is not None:
        return cached
    url = _read_data_url(info, name)
    if url is not None:
        _data_cache.put(name, url)
    return url


def _read_data_url(info: FileInfo, name: str) -> str | None:
    storage = Attachment._meta.get_field("file").storage  # type: ignore[attr-defined]
    try:
        with storage.open(name, "rb") as stored:
            raw = stored.read(IMAGE_DATA_BYTES + 1)
    except Exception:  # gone, or the bucket is away: a note says it could not be sent, the reply goes on
        log.warning("image %s (%s) could not be read from storage", info.id, name, exc_info=True)
        return None
    if len(raw) > IMAGE_DATA_BYTES:
        return None
    media = info.content_type if name == info.file else _sniff(raw)
    return f"data:{media};base64,{base64.b64encode(raw).decode('ascii')}"


def _sniff(raw: bytes) -> str:
    for magic, media in _MAGIC:
        if raw.startswith(magic):
            return media
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return "image/webp"
    return "application/octet-stream"
