"""Images as stored: checked, re-encoded and bounded, with a thumbnail (Pillow).

Nothing of the member's file is stored as sent. Its size in pixels is read from the
header first, and more than COLLAB["MAX_IMAGE_PIXELS"] is refused before anything is
decoded (a small file can declare a huge image: a decompression bomb). The picture is
then decoded, turned the way its EXIF orientation says, scaled down to at most
COLLAB["IMAGE_MAX_SIDE"] on its longer side and encoded again in its own format, with
no metadata at all (EXIF, GPS, comments, colour profiles other than the pixels'):
whatever a camera or an editor wrote is gone. A GIF keeps its first frame only.
The thumbnail (THUMB_SIDE, WebP) is what the message shows; a click opens the image.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from django.conf import settings
from PIL import Image, ImageOps, UnidentifiedImageError

from collab.chat.files.errors import corrupt, too_complex

THUMB_SIDE = 480  # the thumbnail's longer side
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


def process(data: bytes, content_type: str) -> Processed:
    """The image re-encoded for storage and its thumbnail; raises file.too_complex (a
    pixel bomb) or file.corrupt."""
    limit = int(settings.COLLAB["MAX_IMAGE_PIXELS"])
    side = int(settings.COLLAB["IMAGE_MAX_SIDE"])
    fmt = _FORMATS[content_type]
    Image.MAX_IMAGE_PIXELS = limit  # Pillow's own guard (a warning past it) at ours
    with warnings.catch_warnings():
        # Pillow warns past its own bound, and raises past twice that: both are ours to say.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data), formats=[fmt]) as opened:
                width, height = opened.size
                if width * height > limit:
                    raise too_complex(f"{width} x {height} pixels; at most {limit:,} are accepted")
                opened.seek(0)  # a GIF's first frame
                opened.load()
                image = ImageOps.exif_transpose(opened) or opened
                image = _pixels(image)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise too_complex("too many pixels") from None
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as exc:
            raise corrupt(f"the image cannot be decoded ({exc.__class__.__name__})") from None
    if max(image.size) > side:
        image.thumbnail((side, side), Image.Resampling.LANCZOS)
    stored = _encode(image, fmt)
    thumb = image.copy()
    thumb.thumbnail((THUMB_SIDE, THUMB_SIDE), Image.Resampling.LANCZOS)
    if thumb.mode not in ("RGB", "RGBA"):
        thumb = thumb.convert("RGBA")
    return Processed(stored, _encode(thumb, "WEBP"), image.width, image.height)
