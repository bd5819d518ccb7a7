"""The page's reconnect back-off, as the load generator's members follow it (issue 38).

The same rule as the page's (docs/wire.md, the close codes): after a drop (1006, 1011,
1012, 1013, 4408, 4503 or a refused handshake) wait ``max(100, random() * min(8000, 500 *
2**retries))`` ms, full jitter, ``retries`` the consecutive failed attempts from 0; after
4429 with the reason ``retry=MS`` (admission control, a draining server) wait ``MS +
random() * MS``; after 4403 stop. Pure: the storm scenario and its tests share it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

__all__ = ["BASE_MS", "CAP_MS", "FLOOR_MS", "delay_ms", "retry_hint_ms"]

BASE_MS = 500.0
CAP_MS = 8000.0
FLOOR_MS = 100.0
FORBIDDEN = 4403
TOO_MANY = 4429

_HINT = re.compile(r"\bretry=(\d+)\b")


def retry_hint_ms(reason: str) -> float | None:
    """The ``retry=MS`` of a close reason, or None."""
    m = _HINT.search(reason or "")
    return float(m.group(1)) if m else None


def delay_ms(
    code: int | None,
    reason: str = "",
    retries: int = 0,
    rand: Callable[[], float] = random.random,
) -> float | None:
    """How long to wait before the next attempt, in ms; None: do not reconnect.

    ``code`` is the close code (None: no close frame, or a refused handshake, which the page
    treats as 1006).
    """
    if code == FORBIDDEN:
        return None
    if code == TOO_MANY:
        hint = retry_hint_ms(reason)
        if hint is not None:
            return hint + rand() * hint
    window = min(CAP_MS, BASE_MS * 2 ** max(0, retries))
    return max(FLOOR_MS, rand() * window)
