"""Filters of the console log (settings.LOGGING)."""

from __future__ import annotations

import logging


class InfoAsDebug(logging.Filter):
    """INFO records of the named loggers (and their children) become DEBUG: shown only when
    that logger is enabled for DEBUG (COLLAB_LOG_LEVEL=DEBUG). For chatty libraries whose
    INFO lines are per request (django-axes: one per login, issue 34); their warnings stay."""

    def __init__(self, prefixes: list[str] | tuple[str, ...] = ()) -> None:
        super().__init__()
        self.prefixes = tuple(prefixes)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not any(
            record.name == p or record.name.startswith(p + ".") for p in self.prefixes
        ):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
