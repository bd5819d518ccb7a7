"""The refusals of an upload (docs/wire.md, "Files"): a ClientError with its HTTP status."""

from __future__ import annotations

from collab.chat.errors import ClientError

# Each code's HTTP status in the upload's answer (collab/chat/file_views.py).
STATUS = {
    "file.missing": 400,
    "file.too_large": 413,
    "file.type_refused": 415,
    "file.corrupt": 422,
    "file.encrypted": 422,
    "file.too_complex": 422,
    "file.rate": 429,
    "room.forbidden": 404,
    "room.locked": 403,
    "room.archived": 403,
    "server.unavailable": 503,
}


class FileRefused(ClientError):
    """An upload refused: nothing of it is stored."""


def too_complex(what: str) -> FileRefused:
    return FileRefused("file.too_complex", f"This file is too complex to process safely ({what}).")


def corrupt(what: str = "it cannot be read") -> FileRefused:
    return FileRefused("file.corrupt", f"This file is damaged: {what}.")
