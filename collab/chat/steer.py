"""Steering a reply while it streams (docs/wire.md, "steer a reply"): the engine's part.
No HTML, no channel layer, no database: what the reply's reader does with a member's note.

A note reaches the process that runs the reply (replies/steering.py), which hands it to
the reply (`generation.Registry.steer`) as a `Note`. The reader (generation.run_reply)
then ends the model's stream at a clean boundary of what it has read (`Steer.clip`):

    the end of the current sentence (`.`, `!`, `?` or `…`, closing quotes or brackets
    included, followed by a space or a newline) or line, if one comes within GRACE_CHARS
    characters of the answer after the note came; else the end of the current word (the
    next space); a model that sends nothing for WAIT_S seconds is cut where it stands;
    a reply with no answer yet (queued, waiting for its first token, or thinking) is cut
    at once.

What was read past the boundary is dropped: nobody was shown it. The marker (`marker`: a
paragraph of its own, "↪ steered by NAME: NOTE") goes into the text as one more piece,
and the model is asked again (`next_messages`): the request it had, its answer since then
as its own turn, the notes as the last user turn. The same task, sink, offsets, shared
record and stored reply go on: members, snapshots and resumes see one growing text.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from collab.chat.markup import STEER_MARK
from collab.llm import Usage
from collab.llm.client import ChatMessage, Item
from collab.llm.content import prompt_estimate

GRACE_CHARS = 200  # how far past the note a sentence's end is waited for; then a word's end
WAIT_S = 3.0  # a stream silent this long after the note (or since its last read) is cut as it stands
MARK = STEER_MARK  # "↪ steered by ": how every marker begins (markup.py shows it as one)

# A sentence's end (followed by a space: "3.14" is not one) or a line's end.
_BOUNDARY = re.compile(r"[.!?\u2026][\"')\]\u201d\u2019]*(?=\s)|\n")
_SPACE = re.compile(r"\s")
_TAIL = 4  # the answer's last characters a boundary is looked for in, with the next piece
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.MULTILINE)


@dataclass(frozen=True)
class Note:
    """One member's note: its marker's line in the text, and what the model is told."""

    marker: str
    prompt: str


@dataclass
class Steer:
    """The notes waiting for the reply's next boundary (several that come before it go
    together). `read`: how many characters of answer came since the first note."""

    notes: list[Note]
    now: bool = False  # no answer yet when it came: cut at the next read (or at once, cancelled)
    read: int = 0
    reads: int = 0  # reads of the stream since it came
    cut: bool = False  # the boundary is reached: the stream ends, the next request starts
    cancelled: bool = False  # its stream was cancelled to cut it (not a stop)
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    def arm(self, cut: Callable[[], None]) -> None:
        """`cut()` once WAIT_S pass with no read of the stream (its model gone silent),
        unless the boundary came first."""
        reads = self.reads

        def check() -> None:
            if self.cut:
                return
            if self.reads != reads:  # still sending: its boundary comes with its text
                self.arm(cut)
            else:
                cut()

        self.timer = asyncio.get_running_loop().call_later(WAIT_S, check)

    def clip(self, items: list[Item], last: str) -> list[Item]:
        """What to keep of one read of the stream (`last`: the answer's last piece so
        far): all of it, or what comes before the boundary (then `cut`)."""
        self.reads += 1
        if self.now:
            self.cut = True
            return []
        kept: list[Item] = []
        tail = last[-_TAIL:]
        for item in items:
            if isinstance(item, str):
                at = self._boundary(tail, item)
                if at is not None:
                    if at:
                        kept.append(item[:at])
                    self.cut = True
                    return kept
                self.read += len(item)
                tail = (tail + item)[-_TAIL:]
            kept.append(item)
        return kept

    def go_on(
        self, messages: list[ChatMessage], parts: list[str], since: int, push: Callable[[str], None]
    ) -> list[ChatMessage]:
        """At the boundary: the marker after the answer's `parts` (this request's from
        `since`), handed on as a piece (`push`); the next request's messages."""
        if self.timer is not None:
            self.timer.cancel()
        answer = "".join(parts[since:])
        mark = marker("".join(parts), self.notes)
        parts.append(mark)
        push(mark)
        return next_messages(messages, answer, self.notes)

    def _boundary(self, tail: str, token: str) -> int | None:
        """Where in `token` the answer ends, if it does in it (0: before it). `tail`: the
        answer's last characters before it (a sentence's end may close in it)."""
        for found in _BOUNDARY.finditer(tail + token):
            if found.group() == "\n":  # a line's end: before its newline (one just read: now)
                if found.start() >= len(tail) - 1:
                    return max(0, found.start() - len(tail))
            elif found.end() >= len(tail):  # a sentence's end whose space is in this token
                return found.end() - len(tail)
        if self.read + len(token) > GRACE_CHARS:  # no sentence's end in sight: a word's
            space = _SPACE.search(token)
            if space is not None:
                return space.start()
        return None


def marker(text: str, notes: Sequence[Note]) -> str:
    """The piece that follows `text` (the answer so far) to mark where it was steered:
    each note's line, a paragraph of its own (an open code block is closed first)."""
    lines = "\n\n".join(note.marker for note in notes) + "\n\n"
    if not text:
        return lines
    fences = _FENCE.findall(text)
    if len(fences) % 2:  # inside a code block: it ends here, the marker is text
        return ("" if text.endswith("\n") else "\n") + fences[-1][0] * 3 + "\n\n" + lines
    return ("" if text.endswith("\n\n") else "\n" if text.endswith("\n") else "\n\n") + lines


def next_messages(messages: list[ChatMessage], answer: str, notes: Sequence[Note]) -> list[ChatMessage]:
    """The next request: the last one, the answer it brought (since the last note, if
    any was written) as the model's own turn, then the notes."""
    said: list[ChatMessage] = [{"role": "assistant", "content": answer}] if answer.strip() else []
    return [*messages, *said, {"role": "user", "content": "\n\n".join(note.prompt for note in notes)}]


@dataclass
class Legs:
    """A steered reply's usage over its requests ("legs"): a leg cut at a boundary
    never sends its usage (its stream was closed), so its tokens are the pieces read
    and its prompt is estimated as a reply's is without usage (~4 characters a token)."""

    completion: int = 0
    prompt: int = 0
    count: int = 0

    def add(self, usage: Usage | None, chunks: int, messages: Sequence[ChatMessage]) -> None:
        self.count += 1
        got = usage.completion_tokens if usage is not None else None
        self.completion += got if got is not None else chunks
        sent = usage.prompt_tokens if usage is not None else None
        self.prompt += sent if sent is not None else prompt_estimate(messages)

    def total(self, usage: Usage | None, chunks: int, messages: Sequence[ChatMessage]) -> Usage | None:
        """The whole reply's usage, the last leg's (`usage`, `chunks`) added; `usage`
        itself for a reply never steered."""
        if not self.count:
            return usage
        self.add(usage, chunks, messages)
        return Usage(self.prompt, self.completion)
