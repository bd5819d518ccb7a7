"""The one error a client is shown: a dotted code and a human sentence."""

from __future__ import annotations


class ClientError(Exception):
    """An error shown to the one client that caused it, with a dotted code (docs/wire.md)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
