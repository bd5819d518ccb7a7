"""Images as stored: checked, re-encoded and bounded, with a thumbnail (Pillow).

Nothing of the member's file is stored as sent. Its size in pixels is read from the
header first, and more than COLLAB["MAX_IMAGE_PIXELS"] is refused before anything is
decoded (a small file can declare a huge image: a decompression bomb). The picture is
then decoded, turned the way its EXIF orientation says, scaled down to at most
COLLAB["IMAGE_MAX_SIDE"] on its longer side and encoded again in its own format, with
no metadata at all (EXIF, GPS, comments, colour profiles other than the pixels'):
whatever a camera or an editor wrote is gone. An animated GIF or WebP stays animated
(each frame copied the same way; all its frames together count against the pixel limit).
The thumbnail (THUMB_SIDE, WebP) is what the message shows; a click opens the image.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from PIL import Image, ImageOps, UnidentifiedImageError

from collab.chat.files.errors import corrupt, too_complex

THUMB_SIDE = 480  # the thumbnail's longer side
MAX_FRAMES = 500  # an animation's frames, at most
_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/gif": "GIF", "image/webp": "WEBP"}


@dataclass(frozen=True)
class Processed:
    data: bytes
    thumb: bytes
    width: int
    height: int


def _encode(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    if fmt == "JPEG":
        image.convert("RGB").save(out, "JPEG", quality=88, optimize=True)
    elif fmt == "WEBP":
        image.save(out, "WEBP", quality=88)
    elif fmt == "GIF":
        image.save(out, "GIF")
    else:
        image.save(out, "PNG", optimize=False)
    return out.getvalue()


def _pixels(image: Image.Image) -> Image.Image:
    """A copy of the pixels only: a new image gets none of the source's info (EXIF, text
    chunks, ICC, XMP), whatever format-specific keys Pillow keeps."""
    mode = image.mode
    if mode not in ("1", "L", "LA", "P", "RGB", "RGBA"):
        mode = "RGBA" if "A" in image.getbands() else "RGB"
        image = image.convert(mode)
    clean = Image.new(mode, image.size)
    clean.paste(image)
    if mode == "P":
        palette = image.getpalette()
        if palette is not None:
            clean.putpalette(palette)
        if "transparency" in image.info and isinstance(image.info["transparency"], int):
            clean.info["transparency"] = image.info["transparency"]
    return clean


def _frames(opened: Image.Image, limit: int) -> tuple[list[Image.Image], list[int]]:
    """An animation's frames, as Pillow composes them, and their durations (ms); refused
    past MAX_FRAMES or past the pixel limit in all (every frame is decoded)."""
    count = int(getattr(opened, "n_frames", 1))
    width, height = opened.size
    if count > MAX_FRAMES or width * height * count > limit:
        raise too_complex(f"an animation of {count} frames of {width} x {height} pixels")
    frames, durations = [], []
    for n in range(count):
        opened.seek(n)
        frames.append(_pixels(opened.convert("RGBA")))
        durations.append(max(20, int(opened.info.get("duration", 100) or 100)))
    return frames, durations


def _encode_animation(frames: list[Image.Image], durations: list[int], fmt: str, loop: int) -> bytes:
    out = io.BytesIO()
    options: dict[str, Any] = {"save_all": True, "append_images": frames[1:], "duration": durations, "loop": loop}
    if fmt == "GIF":
        frames[0].save(out, "GIF", disposal=2, **options)
    else:
        frames[0].save(out, "WEBP", quality=88, **options)
    return out.getvalue()


def process(data: bytes, content_type: str) -> Processed:
    """The image re-encoded for storage and its thumbnail; raises file.too_complex (a
    pixel bomb) or file.corrupt."""
    limit = int(settings.COLLAB["MAX_IMAGE_PIXELS"])
    side = int(settings.COLLAB["IMAGE_MAX_SIDE"])
    fmt = _FORMATS[content_type]
    Image.MAX_IMAGE_PIXELS = limit  # Pillow's own guard (a warning past it) at ours
    frames: list[Image.Image] = []
    durations: list[int] = []
    loop = 0
    with warnings.catch_warnings():
        # Pillow warns past its own bound, and raises past twice that: both are ours to say.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data), formats=[fmt]) as opened:
                width, height = opened.size
                if width * height > limit:
                    raise too_complex(f"{width} x {height} pixels; at most {limit:,} are accepted")
                if fmt in ("GIF", "WEBP") and getattr(opened, "n_frames", 1) > 1:
                    frames, durations = _frames(opened, limit)
                    loop = int(opened.info.get("loop", 0) or 0)
                    image = frames[0]
                else:
                    if fmt == "JPEG":
                        opened.draft(opened.mode, (side, side))  # decode at 1/2, 1/4, 1/8 when that is enough
                    opened.load()
                    image = _pixels(ImageOps.exif_transpose(opened) or opened)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise too_complex("too many pixels") from None
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as exc:
            raise corrupt(f"the image cannot be decoded ({exc.__class__.__name__})") from None
    if frames:
        for frame in frames:
            frame.thumbnail((side, side), Image.Resampling.LANCZOS)
        stored = _encode_animation(frames, durations, fmt, loop)
        image = frames[0]
    else:
        if max(image.size) > side:
            image.thumbnail((side, side), Image.Resampling.LANCZOS)
        stored = _encode(image, fmt)
    thumb = image.copy()
    thumb.thumbnail((THUMB_SIDE, THUMB_SIDE), Image.Resampling.LANCZOS)
    if thumb.mode not in ("RGB", "RGBA"):
        thumb = thumb.convert("RGBA")
    return Processed(stored, _encode(thumb, "WEBP"), image.width, image.height)
