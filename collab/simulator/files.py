"""Images and documents in a request, as the simulated model receives them (README,
"Files"): `image_url` content parts (a base64 data URL, or an http(s) link, never
fetched) and the document blocks collab writes into a turn's text:

    [file spec.pdf: application/pdf, 12 pages; the parts that match ...: pages 3, 7 of 12 (file id 5)]
    [page 3]
    ...
    [end of file spec.pdf]

A request that holds any is answered with a first line that proves what arrived:
``Received 2 images: image/png 1234 bytes 64x48; url http://host/files/s/…. Documents:
spec.pdf page 3 "the first words of the part…".`` (`proof`), then the usual text. The
record a test reads (`SimulatorApp.recorded`) holds each image as its media type, size
and pixels, never its bytes (`for_record`).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
import struct
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Image", "documents", "for_record", "images", "proof"]

FIRST_WORDS = 6
_DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)(?:;[\w=.+-]+)*;base64,(?P<data>.*)", re.S)
_BLOCK = re.compile(r"^\[file (?P<name>[^:\n\]]+): [^\n]*\]\n(?P<body>.*?)\n\[end of file (?P=name)\]$", re.S | re.M)
_PAGE = re.compile(r"^\[page (\d+)\]$", re.M)


@dataclasses.dataclass(frozen=True)
class Image:
    media_type: str  # as the data URL says ("url" for a link)
    size: int  # decoded bytes (0 for a link)
    width: int | None = None
    height: int | None = None
    url: str = ""  # a link's address

    def shown(self) -> str:
        if self.url:
            return f"url {self.url[:80]}"
        pixels = f" {self.width}x{self.height}" if self.width and self.height else ""
        return f"{self.media_type} {self.size} bytes{pixels}"

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _parts(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    found: list[Mapping[str, Any]] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            found.extend(p for p in content if isinstance(p, Mapping))
    return found


def _url_of(part: Mapping[str, Any]) -> str:
    holder = part.get("image_url")
    url = holder.get("url") if isinstance(holder, Mapping) else holder
    if not isinstance(url, str) or not url:
        raise ValueError("Invalid content part: 'image_url.url' must be a non-empty string.")
    return url


def image_of(url: str) -> Image:
    """An image part's URL as received: ValueError for one the API would refuse."""
    if url.startswith(("http://", "https://")):
        return Image("url", 0, url=url)
    found = _DATA_URL.fullmatch(url)
    if found is None:
        raise ValueError("Invalid image URL: expected a base64 data URL or an http(s) URL.")
    try:
        raw = base64.b64decode(found["data"], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("Invalid image data: not valid base64.") from None
    width, height = pixels(raw)
    return Image(found["type"], len(raw), width, height)


def images(messages: Sequence[Mapping[str, Any]]) -> list[Image]:
    """The request's image parts, in order (ValueError: a malformed one)."""
    return [image_of(_url_of(p)) for p in _parts(messages) if p.get("type") == "image_url"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


def documents(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each document part in the request's turns: its file, page, and first words."""
    found: list[str] = []
    for message in messages:
        text = _text(message.get("content"))
        if "[file " not in text:
            continue
        for block in _BLOCK.finditer(text):
            body = block["body"]
            pages = list(_PAGE.finditer(body))
            if not pages:
                found.append(f'{block["name"]} "{_first_words(body)}"')
                continue
            for i, page in enumerate(pages):
                end = pages[i + 1].start() if i + 1 < len(pages) else len(body)
                found.append(f'{block["name"]} page {page[1]} "{_first_words(body[page.end() : end])}"')
    return found


def _first_words(text: str) -> str:
    words = text.split()
    return " ".join(words[:FIRST_WORDS]) + ("…" if len(words) > FIRST_WORDS else "")


def proof(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The line that proves what the request held of files; None when it held none."""
    seen = images(messages)
    docs = documents(messages)
    if not seen and not docs:
        return None
    count = f"{len(seen)} image{'' if len(seen) == 1 else 's'}"
    line = f"Received {count}" + (": " + "; ".join(i.shown() for i in seen) if seen else "") + "."
    if docs:
        line += " Documents: " + "; ".join(docs) + "."
    return line


def for_record(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The messages as a test reads them (a data URL as `data:TYPE;base64,<N bytes>`), and
    the images' descriptions; the messages themselves when they hold no image."""
    if not any(p.get("type") == "image_url" for p in _parts(messages)):
        return messages, []
    kept: list[dict[str, Any]] = []
    seen: list[dict[str, Any]] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            kept.append(message)
            continue
        parts: list[Any] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "image_url":
                image = image_of(_url_of(part))
                seen.append(image.record())
                url = image.url or f"data:{image.media_type};base64,<{image.size} bytes>"
                parts.append({"type": "image_url", "image_url": {"url": url}})
            else:
                parts.append(part)
        kept.append({**message, "content": parts})
    return kept, seen


def pixels(raw: bytes) -> tuple[int | None, int | None]:
    """Width and height from a PNG, GIF, JPEG or WebP header (None, None: not known)."""
    try:
        if raw.startswith(b"\x89PNG\r\n\x1a\n") and raw[12:16] == b"IHDR":
            w, h = struct.unpack(">II", raw[16:24])
            return int(w), int(h)
        if raw[:6] in (b"GIF87a", b"GIF89a"):
            w, h = struct.unpack("<HH", raw[6:10])
            return int(w), int(h)
        if raw.startswith(b"\xff\xd8"):
            return _jpeg_pixels(raw)
        if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
            return _webp_pixels(raw)
    except struct.error:
        pass
    return None, None


def _jpeg_pixels(raw: bytes) -> tuple[int | None, int | None]:
    at = 2
    while at + 9 < len(raw):
        if raw[at] != 0xFF:
            return None, None
        marker = raw[at + 1]
        (length,) = struct.unpack(">H", raw[at + 2 : at + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a start of frame
            h, w = struct.unpack(">HH", raw[at + 5 : at + 9])
            return int(w), int(h)
        at += 2 + length
    return None, None


def _webp_pixels(raw: bytes) -> tuple[int | None, int | None]:
    chunk = raw[12:16]
    if chunk == b"VP8X":
        w = int.from_bytes(raw[24:27], "little") + 1
        h = int.from_bytes(raw[27:30], "little") + 1
        return w, h
    if chunk == b"VP8L":
        bits = int.from_bytes(raw[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 ":
        w, h = struct.unpack("<HH", raw[26:30])
        return int(w) & 0x3FFF, int(h) & 0x3FFF
    return None, None
