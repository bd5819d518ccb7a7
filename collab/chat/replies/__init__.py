"""The reply pipeline: a post is stored, its replies' model requests start (some before
the post is stored: early.py, private to this package), each reply streams through its
sink (live text in the shared state, frames to the room) and ends stored.

    posting.py       post_message: the entry of a post (store_post, then start its replies)
    jobs.py          what a reply's model is sent (ReplyJob), its placeholder, its start
    early.py         model requests sent before their post is stored, checked after
    sink.py          where the engine hands a reply's pieces, thoughts and outcome
    again.py         regenerate;  continuation.py: continue;  merging.py: merge
    each.py          `/each`: one personal reply per member with a lens
    agents.py, tools.py, http_tools.py, tool_spec.py   an agent's plan and tools
    interrupt.py     end a reply that no process runs any more

What the layers above use of early.py goes through the functions below.
"""

from __future__ import annotations

from collab.chat import fanout
from collab.chat.replies import early


def install() -> None:
    """At start-up (apps.py): the model rows' signals, and the room frames this process
    receives, keep what it knows of its rooms current (early.py)."""
    early.connect_signals()
    fanout.watchers.watch = early.watch
    fanout.watchers.unwatch = early.unwatch
    fanout.watchers.saw = early.saw


def context_changed(room_id: int | None) -> None:
    """What replies' context is built from changed without a frame (a room's settings;
    None: any room): once committed, every process forgets what it knew of it."""
    early.changed(room_id)


def forget(room_id: int | None) -> None:
    """This process forgets what it knew of a room (None: of every room)."""
    if room_id is None:
        early.forget_all()
    else:
        early.forget(room_id)


def distrust(away: bool) -> None:
    """The channel layer is away (True) or back and resynced (False): early.distrust."""
    early.distrust(away)
