"""The first of Django's upload handlers (settings.FILE_UPLOAD_HANDLERS): an upload past
COLLAB["MAX_FILE_BYTES"] is refused before its bytes are parsed or spooled to disk.

The CSRF check reads the request's form (and so parses its files) before any view
runs, so a view alone would always receive a too-large file whole first. Here a
request whose declared length exceeds the cap (plus the multipart envelope) is not
parsed at all, and one file that grows past the cap while parsed stops the parse; the
request is marked (`too_large_upload`) and collab/chat/file_views.py answers
file.too_large. The CSRF token still arrives in its header (X-CSRFToken).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.http import QueryDict
from django.utils.datastructures import MultiValueDict

# The multipart envelope around one file: boundaries, headers, a long file name.
ENVELOPE = 64 << 10
MARK = "too_large_upload"


class CappedUploadHandler(FileUploadHandler):
    received = 0

    def _limit(self) -> int:
        return int(settings.COLLAB["MAX_FILE_BYTES"])

    def handle_raw_input(
        self, input_data: Any, META: dict[str, Any], content_length: int, boundary: Any, encoding: str | None = None
    ) -> tuple[QueryDict, MultiValueDict[str, Any]] | None:
        if content_length > self._limit() + ENVELOPE:
            setattr(self.request, MARK, True)
            return QueryDict(encoding=encoding), MultiValueDict()  # nothing parsed
        return None

    def new_file(self, *args: Any, **kwargs: Any) -> None:
        super().new_file(*args, **kwargs)
        self.received = 0

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        self.received += len(raw_data)
        if self.received > self._limit():
            setattr(self.request, MARK, True)
            raise StopUpload(connection_reset=True)
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None  # the next handlers keep the file
