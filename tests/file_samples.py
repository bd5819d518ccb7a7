"""Files for the upload tests, made in code (tests/test_files_upload.py, test_files_s3.py):
images with camera metadata, PDFs built by hand, encrypted, damaged and bombed ones,
DOCX (a real one and a zip bomb), and markup disguised as an image."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

from PIL import Image


def jpeg_with_gps(size: tuple[int, int] = (640, 480)) -> bytes:
    """A JPEG with a camera's EXIF (make, a GPS position) and an orientation (6: turned)."""
    image = Image.new("RGB", size, (30, 120, 200))
    exif = image.getexif()
    exif[0x010F] = "SpyCam"  # Make
    exif[0x0112] = 6  # Orientation: rotate 90° clockwise to show
    gps = exif.get_ifd(0x8825)
    gps[1], gps[2], gps[3], gps[4] = "N", (48.0, 51.0, 29.0), "E", (2.0, 17.0, 40.0)
    out = io.BytesIO()
    image.save(out, "JPEG", exif=exif, comment=b"secret comment")
    return out.getvalue()


def png_with_text(size: tuple[int, int] = (300, 200)) -> bytes:
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("Author", "someone private")
    image = Image.new("RGBA", size, (200, 30, 30, 128))
    exif = image.getexif()
    exif[0x010F] = "SpyCam"
    out = io.BytesIO()
    image.save(out, "PNG", pnginfo=info, exif=exif)
    return out.getvalue()


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def png_pixel_bomb(width: int = 60_000, height: int = 60_000) -> bytes:
    """A PNG of a few hundred bytes that declares width x height pixels."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    data = zlib.compress(b"\x00" * 1024)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", data) + _chunk(b"IEND", b"")


def _pdf(contents: list[bytes], extra_stream_dict: bytes = b"") -> bytes:
    """A PDF whose pages draw these content streams (Helvetica)."""
    n = len(contents)
    objects: list[bytes] = [b"<< /Type /Catalog /Pages 2 0 R >>"]
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n)).encode()
    objects.append(b"<< /Type /Pages /Kids [" + kids + b"] /Count " + str(n).encode() + b" >>")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, content in enumerate(contents):
        page = (
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
            b"/Contents " + str(5 + 2 * i).encode() + b" 0 R >>"
        )
        stream = b"<< /Length " + str(len(content)).encode() + extra_stream_dict + b" >>\nstream\n" + content
        objects += [page, stream + b"\nendstream"]
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def pdf(pages: list[str]) -> bytes:
    """A PDF with one line of text per page (ASCII: drawn as a literal string)."""
    streams = []
    for text in pages:
        safe = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        streams.append(f"BT /F1 12 Tf 72 720 Td ({safe}) Tj ET".encode())
    return _pdf(streams)


def pdf_bomb(megabytes: int = 120) -> bytes:
    """A PDF of ~100 KB whose one page's content stream inflates to `megabytes` MB."""
    squeeze = zlib.compressobj(9)
    zeros = b" " * (1 << 20)
    packed = b"".join(squeeze.compress(zeros) for _ in range(megabytes)) + squeeze.flush()
    return _pdf([packed], b" /Filter /FlateDecode")


def encrypted_pdf(user_password: str = "secret", owner_password: str = "owner") -> bytes:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf(["confidential plans"]))))
    writer.encrypt(user_password=user_password, owner_password=owner_password, algorithm="AES-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def corrupt_pdf() -> bytes:
    return b"%PDF-1.7\n1 0 obj << /Type /Catalog /Pages 9 0 R" + bytes(range(256)) * 8


def docx(paragraphs: list[str]) -> bytes:
    import docx as python_docx

    document = python_docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def docx_bomb(megabytes: int) -> bytes:
    """A real DOCX with one more member that inflates to `megabytes` MB of zeros."""
    out = io.BytesIO(docx(["a harmless paragraph"]))
    with (
        zipfile.ZipFile(out, "a", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf,
        zf.open("word/media/zeros.bin", "w") as member,
    ):
        for _ in range(megabytes):
            member.write(b"\x00" * (1 << 20))
    return out.getvalue()


HTML_AS_PNG = b"<!DOCTYPE html><html><body><script>alert(document.cookie)</script></body></html>"
SVG = b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'


def animated_gif(frames: int = 3, size: tuple[int, int] = (400, 300)) -> bytes:
    """An animated GIF, each frame a colour, with a comment."""
    images = [Image.new("RGB", size, (80 * n % 256, 40, 200)) for n in range(frames)]
    out = io.BytesIO()
    images[0].save(
        out, "GIF", save_all=True, append_images=images[1:], duration=120, loop=0, comment=b"made by someone private"
    )
    return out.getvalue()
