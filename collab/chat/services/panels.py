"""Room panels: parts of the room page's side column that a command adds (the pinned
messages, commands/pins.py), shown on the page (views.room) and in every snapshot
(snapshot.py), and replaced by the command's own frames when they change.

A panel is a function (room_id, user_id, oob) -> HTML, registered at import by the
command module that owns it: this layer never imports a command. Its HTML is one
element with an id of its own; `oob`: as a frame swaps it in (hx-swap-oob).
"""

from __future__ import annotations

from collections.abc import Callable

Panel = Callable[[int, int | None, bool], str]

PANELS: list[Panel] = []


def panel(render: Panel) -> Panel:
    """Register a panel (a decorator); shown in the order registered."""
    PANELS.append(render)
    return render


def render_all(room_id: int, user_id: int | None, oob: bool) -> str:
    """Every panel of the room as `user_id` sees it (database thread)."""
    return "".join(render(room_id, user_id, oob) for render in PANELS)
