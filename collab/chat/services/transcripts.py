"""Room transcripts, for the admin's export: a zip with, per room, `<slug>.md` (Markdown,
for people) and `<slug>.jsonl` (JSON Lines, one message per line, for programs).

Every message is in both, in seq order, with its seq, author, role, status, time and
text; a personal reply (`/each`) not shared yet says whose it is (`recipient`, and "for
NAME only" in the Markdown), so that it never reads as a message the room saw. A reply
still streaming is there with the text stored so far (its checkpoint: at most
`CHECKPOINT_S` behind the live text) and status `streaming`. Each room exported leaves one
audit row ("export"), written once the zip is complete.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import IO, Any

from django.db import transaction
from django.utils import timezone

from collab.chat import emojis
from collab.chat.errors import ClientError
from collab.chat.models import Message, Room
from collab.chat.services import moderation

MAX_ROOMS = 200  # one export; more rooms: several exports
SPOOL_BYTES = 8 * 1024 * 1024  # a zip larger than this goes to a temporary file
FIELDS = (
    "id",
    "seq",
    "author_name",
    "role",
    "status",
    "created_at",
    "finished_at",
    "assistant__handle",
    "model",
    "tokens",
    "prompt_tokens",
    "cost",
    "error",
    "text",
    "reasoning",
    "finish_reason",
    "votes_up",  # votes on a reply (commands/votes.py): counts, verdict, who voted what and when
    "votes_down",
    "verdict",
    "votes_by",
    "pinned_at",  # on the room's pinned list (commands/pins.py): since when, and by whom
    "pinned_by_name",
    "recipient__username",  # a personal reply not shared yet: whose it is (None: the room's)
    "made_for",  # a personal reply, shared or not: whom it was made for, and with which lens
    "lens",
    "merge_seqs",  # a merge: the seqs of the answers it combines
    "version",  # a reply's versions (regenerate: docs/architecture.md#a-versions), every one kept
    "versions",
    "slot_seq",
    "version_hidden",
    "thread__seq",  # a message in a thread: the seq of the message it hangs on (services/threads.py)
    "reactions",  # emoji reactions (commands/reactions.py): each emoji, how many, who
)


def _iso(at: datetime | None) -> str | None:
    return at.astimezone(UTC).isoformat(timespec="milliseconds") if at is not None else None


def record_of(row: dict[str, Any]) -> dict[str, object]:
    """One message as a line of the JSON Lines file."""
    return {
        "seq": row["seq"],
        "id": row["id"],
        "author": row["author_name"],
        "role": row["role"],
        "assistant": row["assistant__handle"],
        "status": row["status"],
        "time": _iso(row["created_at"]),
        "finished": _iso(row["finished_at"]),
        "model": row["model"] or None,
        "tokens": row["tokens"],
        "prompt_tokens": row["prompt_tokens"],
        "cost": str(row["cost"]) if row["cost"] is not None else None,
        "error": row["error"] or None,
        "text": row["text"],
        "reasoning": row["reasoning"] or None,  # a reasoning model's thinking, apart from the text
        "finish_reason": row["finish_reason"] or None,  # "length": cut off at the token limit
        "votes": _votes(row),
        "pinned": {"by": row["pinned_by_name"], "at": _iso(row["pinned_at"])} if row["pinned_at"] else None,
        "recipient": row["recipient__username"],
        "made_for": row["made_for"] or None,
        "lens": row["lens"] or None,
        "merged_from": row["merge_seqs"] or None,
        "reactions": _reactions(row),
        **_version(row),
        "thread": row["thread__seq"],
    }


def _reactions(row: dict[str, Any]) -> list[dict[str, object]] | None:
    """Each emoji given, in the order first given: its name, how many gave it and who; None
    for a message nobody reacted to."""
    given = [r for r in row["reactions"] or () if r.get("by")]
    if not given:
        return None
    return [
        {"emoji": r["emoji"], "name": emojis.name_of(r["emoji"]), "count": len(r["by"]), "by": r["by"]} for r in given
    ]


def _version(row: dict[str, Any]) -> dict[str, object]:
    """A reply asked again: its number, how many versions its slot has, the seq of the
    slot's first version (None for the first itself), and whether the room shows it. Any
    other message: no numbers, shown."""
    if row["versions"] < 2:
        return {"version": None, "versions": None, "version_of": None, "shown": True}
    return {
        "version": row["version"],
        "versions": row["versions"],
        "version_of": row["slot_seq"],
        "shown": not row["version_hidden"],
    }


def _votes(row: dict[str, Any]) -> dict[str, object] | None:
    """A reply's votes: the counts, the verdict, and each vote (voter, value, time); None
    for a person's message, or a reply nobody voted on."""
    if row["role"] != Message.Role.ASSISTANT or not row["votes_by"]:
        return None
    return {"up": row["votes_up"], "down": row["votes_down"], "verdict": row["verdict"] or None, "by": row["votes_by"]}


def markdown_head(room: Room, count: int, exported_at: datetime, by: str) -> str:
    lines = [f"# {room.name} ({room.slug})", ""]
    if room.topic:
        lines += [f"Topic: {room.topic}", ""]
    lines += [
        f"Status: {room.status}. {count} messages. Exported {_iso(exported_at)} by {by}.",
        "",
    ]
    return "\n".join(lines) + "\n"


def markdown_message(record: dict[str, object]) -> str:
    """One message: a heading line with who, what and when, then its text as written."""
    who = str(record["author"])
    if record["assistant"]:
        who += f" (@{record['assistant']})"
    status = str(record["status"])
    if status == Message.Status.STREAMING:
        status = "streaming: the text so far"
    head = f"### #{record['seq']} {who} · {record['role']}, {status} · {record['time']}"
    if record.get("recipient"):  # a personal reply: the room never saw it
        head += f" · for {record['recipient']} only"
    elif record.get("made_for"):  # a personal reply its recipient shared with the room
        head += f" · for {record['made_for']}, shared"
    if record.get("thread"):  # a reply in a thread, marked under the message it hangs on
        head = f"{head} · in the thread on #{record['thread']}"
    body = str(record["text"]) or "_(no text)_"
    if record.get("reasoning"):  # the thinking, folded, before the answer
        body = f"<details><summary>Thinking</summary>\n\n{record['reasoning']}\n\n</details>\n\n{body}"
    tail = f"\n\n> error: {record['error']}" if record["error"] else ""
    if record.get("lens"):
        tail += f"\n\n> lens: {record['lens']}"
    merged = record.get("merged_from")
    if isinstance(merged, list):  # the same numbers as the headings above
        tail += "\n\n> merged from " + ", ".join(f"#{seq}" for seq in merged)
    if record.get("finish_reason") == "length":
        tail += "\n\n> cut off at the token limit"
    votes = record.get("votes")
    if isinstance(votes, dict):  # "> votes: 2 up (alice, bob), 1 down (carol); approved"
        by = votes["by"]
        names = {v: ", ".join(b["voter"] for b in by if b["value"] == v) for v in ("up", "down")}
        sides = [f"{votes[v]} {v} ({names[v]})" for v in ("up", "down") if votes[v]]
        tail += f"\n\n> votes: {', '.join(sides)}" + (f"; {votes['verdict']}" if votes["verdict"] else "")
    pinned = record.get("pinned")
    if isinstance(pinned, dict):  # "> pinned by alice at 2026-12-05T19:02:03.000+00:00"
        tail += f"\n\n> pinned by {pinned['by']} at {pinned['at']}"
    given = record.get("reactions")
    if isinstance(given, list):  # "> reactions: 👍 2 (alice, bob), 🎉 1 (carol)"
        tail += "\n\n> reactions: " + ", ".join(f"{r['emoji']} {r['count']} ({', '.join(r['by'])})" for r in given)
    if record.get("versions"):  # "> version 1 of 2 (shown)", "> version 2 of 2, asked again from #5"
        tail += f"\n\n> version {record['version']} of {record['versions']}" + (" (shown)" if record["shown"] else "")
        tail += f", asked again from #{record['version_of']}" if record["version_of"] else ""
    return f"{head}\n\n{body}{tail}\n\n"


def _messages(room: Room) -> Iterator[dict[str, object]]:
    rows = Message.objects.filter(room=room).order_by("seq").values(*FIELDS)
    for row in rows.iterator(chunk_size=500):
        yield record_of(row)


def write_room(archive: zipfile.ZipFile, room: Room, exported_at: datetime, by: str) -> int:
    """The room's two files, from one read of its messages; the number of messages."""
    written = 0
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as markdown:
        with archive.open(f"{room.slug}.jsonl", "w") as jsonl:
            for record in _messages(room):
                jsonl.write(json.dumps(record, ensure_ascii=False).encode() + b"\n")
                markdown.write(markdown_message(record).encode())
                written += 1
        markdown.seek(0)
        with archive.open(f"{room.slug}.md", "w") as out:
            out.write(markdown_head(room, written, exported_at, by).encode())
            shutil.copyfileobj(markdown, out)
    return written


def export(actor: moderation.Actor, rooms: Iterable[Room]) -> IO[bytes]:
    """The zip of the rooms' transcripts, read from its start; one audit row per room."""
    if not (actor.user.is_active and actor.user.is_staff):
        raise ClientError("room.not_allowed", "Only staff can export transcripts.")
    chosen = sorted(rooms, key=lambda r: r.slug)
    if not chosen:
        raise ClientError("export.empty", "Choose at least one room to export.")
    if len(chosen) > MAX_ROOMS:
        raise ClientError("export.too_many", f"Export at most {MAX_ROOMS} rooms at once.")
    exported_at = timezone.now()
    out = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115 (returned open: the caller sends and closes it)
    counts: list[tuple[Room, int]] = []
    try:
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for room in chosen:
                counts.append((room, write_room(archive, room, exported_at, actor.name)))
        with transaction.atomic():
            for room, count in counts:
                moderation.record(actor, "export", room, detail=f"{count} messages")
    except BaseException:
        out.close()
        raise
    out.seek(0)
    return out
