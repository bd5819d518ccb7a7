"""`--every SECONDS` of the commands `serve` keeps running beside Daphne (refresh_mcp_tools,
sweep_uploads): a job run once, or again and again until the process is stopped."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from django.core.management.base import CommandError
from django.db import close_old_connections


def every(seconds: float, job: Callable[[], None]) -> None:
    """Run `job` once (`seconds` 0), or every `seconds` from the start of one run to the
    next's, until the process is stopped."""
    if seconds < 0:
        raise CommandError("--every wants 0 (once) or more seconds")
    stop = threading.Event()
    while True:
        started = time.monotonic()
        job()
        if seconds <= 0:
            return
        close_old_connections()  # a long-lived loop: no connection kept across sleeps
        # The schedule itself: nothing to wait on but the clock (a stop ends the process).
        stop.wait(max(0.0, seconds - (time.monotonic() - started)))
