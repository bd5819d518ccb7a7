"""Posts that carry files, as the load generator plays them (the `files` scenario).

A share of the posts first uploads a file over HTTP as the page does (POST
/r/<slug>/files/, the session cookie and a CSRF token), then posts with `files: [id]`.
Half are a ~200 KB image, half a ~1 MB PDF of text (made once per process, each upload
varied by a few bytes so that no layer can cache it). Measured: the upload's time by kind
and the server's extraction time the upload answers with; the reply that follows is
measured like any other post's, from the moment it is sent (the upload is not in it).
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import random
import secrets
import time
from typing import Any
from urllib.parse import urlsplit

from collab.loadtest.stats import Collector, Histogram, percentiles

__all__ = ["FileUploads", "files_line", "files_report", "make_image", "make_pdf"]

IMAGE_BYTES = 200_000
PDF_BYTES = 1_000_000
_HISTS = ("upload_image_ms", "upload_pdf_ms", "extract_pdf_ms")

_WORDS = [
    "stream",
    "token",
    "room",
    "member",
    "reply",
    "latency",
    "budget",
    "socket",
    "frame",
    "process",
    "redis",
    "model",
    "snapshot",
]


def make_image(target: int = IMAGE_BYTES, seed: int = 0) -> bytes:
    """A JPEG of about `target` bytes: noise, which compresses poorly, sized to fit."""
    from PIL import Image

    rng = random.Random(seed)
    side = 320
    while True:
        noise = rng.randbytes(side * side * 3)
        out = io.BytesIO()
        Image.frombytes("RGB", (side, side), noise).save(out, "JPEG", quality=85)
        if out.tell() >= target * 0.9 or side >= 2000:
            return out.getvalue()
        side = int(side * (target / out.tell()) ** 0.5) + 8


def make_pdf(target: int = PDF_BYTES, seed: int = 0) -> bytes:
    """A PDF of about `target` bytes: pages of plain words in uncompressed text streams
    (text a server can extract), written by hand so the generator needs no PDF library."""
    rng = random.Random(seed)
    objects: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    kids: list[int] = []
    size = 0
    page = 0
    while size < target:
        page += 1
        lines = [f"Page {page}"] + [" ".join(rng.choice(_WORDS) for _ in range(12)) for _ in range(48)]
        body = "BT /F1 9 Tf 40 800 Td 11 TL " + " ".join(f"({line}) '" for line in lines) + " ET"
        stream = body.encode("ascii")
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
        content = len(objects)
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents %d 0 R "
            b"/Resources << /Font << /F1 3 0 R >> >> >>" % content
        )
        kids.append(len(objects))
        size += len(stream) + 120
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % k for k in kids), len(kids))
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for i, obj in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (i, obj))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.writelines(b"%010d 00000 n \n" % off for off in offsets)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def _vary(data: bytes, kind: str) -> bytes:
    """The same file with a few different bytes: a comment after the PDF's end, or a
    JPEG comment segment after its start marker."""
    tag = secrets.token_hex(8).encode()
    if kind == "pdf":
        return data + b"%" + tag + b"\n"
    return data[:2] + b"\xff\xfe" + (len(tag) + 2).to_bytes(2, "big") + tag + data[2:]


def _multipart(name: str, content_type: str, data: bytes) -> tuple[str, bytes]:
    boundary = "collab" + secrets.token_hex(12)
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
        f"Content-Type: {content_type}\r\n\r\n"
    ).encode()
    return boundary, head + data + f"\r\n--{boundary}--\r\n".encode()


class FileUploads:
    """One load-generator process's uploads: the files, and how each went."""

    def __init__(self, collector: Collector, share: float, seed: int = 0) -> None:
        self.collector = collector
        self.share = share
        self.rng = random.Random(seed)
        self._files = {"image": make_image(seed=seed), "pdf": make_pdf(seed=seed)}
        self._n = 0

    def wants_file(self) -> bool:
        return self.share > 0 and self.rng.random() < self.share

    def upload(self, target: str, slug: str, session: str) -> int | None:
        """Upload the next file (image and PDF in turn) as `session`; its id, or None
        (an error counted) when the server refused it or did not answer."""
        kind = "image" if self._n % 2 == 0 else "pdf"
        self._n += 1
        name, ctype = ("shot.jpg", "image/jpeg") if kind == "image" else ("spec.pdf", "application/pdf")
        boundary, body = _multipart(name, ctype, _vary(self._files[kind], kind))
        csrf = secrets.token_hex(16)  # the cookie and the header agree: Django's double submit
        parts = urlsplit(target)
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=120)
        start = time.perf_counter()
        try:
            conn.request(
                "POST",
                f"/r/{slug}/files/",
                body=body,
                headers={
                    "Content-Type": f"multipart/form-data; boundary={boundary}",
                    "Cookie": f"sessionid={session}; csrftoken={csrf}",
                    "X-CSRFToken": csrf,
                    "Origin": target.rstrip("/"),
                    "Referer": target.rstrip("/") + f"/r/{slug}/",
                },
            )
            resp = conn.getresponse()
            payload = resp.read()
        except OSError:
            self.collector.error("upload.failed")
            return None
        finally:
            conn.close()
        ms = (time.perf_counter() - start) * 1000
        if resp.status != 201:
            code = f"upload.http_{resp.status}"
            with contextlib.suppress(ValueError, KeyError, TypeError):
                code = "upload." + json.loads(payload)["error"]["code"]
            self.collector.error(code)
            return None
        data = json.loads(payload)
        self.collector.count("uploads")
        self.collector.count("upload_bytes", len(body))
        self._add(f"upload_{kind}_ms", ms)
        if kind == "pdf" and data.get("extract_ms") is not None:
            self._add("extract_pdf_ms", float(data["extract_ms"]))
        return int(data["id"])

    def _add(self, name: str, value: float) -> None:
        self.collector.hists.setdefault(name, Histogram()).add(value)


def files_report(col: Collector) -> dict[str, Any] | None:
    """The report's `files` object (None when the level uploaded nothing)."""
    if not col.counts.get("uploads") and not any(k.startswith("upload.") for k in col.error_codes):
        return None
    hists = {name: col.hists.get(name) or Histogram() for name in _HISTS}
    return {
        "uploads": col.counts.get("uploads", 0),
        "upload_mb": round(col.counts.get("upload_bytes", 0) / 1e6, 1),
        "upload_errors": sum(n for k, n in col.error_codes.items() if k.startswith("upload.")),
        **{name: percentiles(h) for name, h in hists.items()},
    }


def files_line(report: dict[str, Any] | None, label: str = "") -> str:
    """One line for a level's `files` object ("" without)."""
    if not report:
        return ""

    def pair(d: dict[str, Any]) -> str:
        return "/".join("-" if d.get(k) is None else f"{d[k]:,.0f}" for k in ("p50", "p99"))

    return (
        f"files{label}: {report['uploads']} uploads ({report['upload_mb']} MB), "
        f"{report['upload_errors']} refused; upload p50/p99 image {pair(report['upload_image_ms'])} ms, "
        f"PDF {pair(report['upload_pdf_ms'])} ms; PDF extraction {pair(report['extract_pdf_ms'])} ms"
    )
