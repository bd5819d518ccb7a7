"""Room history -> the messages a model sees, within a size budget per assistant."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from collab.chat.files.for_models import NO_FILES, Attaching, HistoryFiles, cut_front
from collab.chat.models import Assistant, Message, Room
from collab.llm.client import ChatMessage


class HistoryRow(NamedTuple):
    """One message of a reply's history as the database row's columns (HISTORY_COLUMNS),
    not a model instance, which costs the ORM more to build and is read on every post
    (docs/benchmarks/2026-12-03.md#b-post-reads)."""

    id: int
    seq: int
    role: str
    status: str
    text: str
    author_name: str
    assistant_id: int | None
    reply_to_id: int | None
    verdict: str
    votes_up: int
    votes_down: int
    merge_of: list[int]
    slot_seq: int | None = None  # a later version of a reply: its slot's place (models.Message)
    files: int = 0  # how many files it was posted with (chat/files/for_models.py reads them)


HISTORY_COLUMNS = HistoryRow._fields
HISTORY_MESSAGES = 60  # no more than a budget could hold: a reply's history is the room's last 60
Said = Message | HistoryRow  # what the context (and votes.steer) reads a message from


def row_of(message: Message) -> HistoryRow:
    """A message as its history row (one stored or just read: its fields, as values_list reads them)."""
    return HistoryRow._make(getattr(message, name) for name in HISTORY_COLUMNS)


def build_context(
    assistant: Assistant,
    room: Room,
    history: Sequence[Said],
    budget_chars: int,
    lens: str = "",
    files: HistoryFiles = NO_FILES,
) -> list[ChatMessage]:
    """System prompt and topic first, then as much recent history as fits, oldest first.

    `history` is the room's messages up to and including the one being answered,
    oldest first. The assistant's own earlier replies are `assistant` turns; everyone
    else speaks as `user` with their name in front, so the model knows who said what.
    The newest message is always included (cut from the front if it alone is too long).
    `files`: the history's files (files/for_models.read_files): a message's images and
    documents join its turn, as parts or text, within the budget.
    """
    system = assistant.system_prompt.strip()
    if room.system_prompt.strip():  # the room's own, after the assistant's (docs/wire.md, "room settings")
        system = f"{system}\n\n{room.system_prompt.strip()}".strip()
    if room.topic:
        system = f"{system}\n\nThis chat room is about: {room.topic}".strip()
    system = (
        f"{system}\n\nYou are @{assistant.handle} ({assistant.display_name}) in the room "
        f'"{room.name}". Messages from people start with their name.'
    ).strip()
    if lens:  # a personal reply (`/each`): written for one member, with their lens (services/lenses.py)
        system = f"{system}\n\n{lens}"
    turns: list[ChatMessage] = []
    used = 0
    attaching = Attaching(assistant, budget_chars, files) if files.by_message else None
    for message in reversed(history):
        if message.role == Message.Role.ASSISTANT and message.status == Message.Status.STREAMING:
            continue
        attached = files.of(message.id) if attaching is not None and message.files else ()
        if not message.text and not attached:  # nothing said yet, or deleted (a tombstone: commands/editing.py)
            continue
        if message.role == Message.Role.ASSISTANT and message.assistant_id == assistant.id:
            turn: ChatMessage = {"role": "assistant", "content": message.text}
        else:
            turn = {"role": "user", "content": f"{message.author_name}: {message.text}"}
        cost = len(turn["content"])
        if attaching is not None and attached:  # its images and documents (files/for_models.py)
            turn["content"], cost = attaching.content(turn["content"], attached)
        if used + cost > budget_chars:
            if not turns:  # the message being answered: keep its end
                turn["content"] = cut_front(turn["content"], budget_chars)
                turns.append(turn)
            break
        used += cost
        turns.append(turn)
    turns.reverse()
    return [{"role": "system", "content": system}, *turns]
