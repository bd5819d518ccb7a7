"""The client's actions: one module per topic, each action declared once with `@command`
(registry.py). Importing this package fills the registry; the consumer dispatches from it.

    posting.py     post
    replies.py     stop, regenerate, continue, merge
    votes.py       vote
    editing.py     edit, delete
    lenses.py      lens, share
    presence.py    typing
    pins.py        pin, unpin
    reactions.py   react
    unread.py      read, notify
    versions.py    show_version
    steer.py       steer
    moderation.py  kick, ban, unban, lock, unlock, stop_all
"""

from collab.chat.commands import (
    editing,
    lenses,
    moderation,
    pins,
    posting,
    presence,
    reactions,
    replies,
    steer,
    unread,
    versions,
    votes,
)
from collab.chat.commands.registry import COMMANDS, Ctx, Socket, command, dispatch, parse_action

__all__ = [
    "COMMANDS",
    "Ctx",
    "Socket",
    "command",
    "dispatch",
    "editing",
    "lenses",
    "moderation",
    "parse_action",
    "pins",
    "posting",
    "presence",
    "reactions",
    "replies",
    "steer",
    "unread",
    "versions",
    "votes",
]
