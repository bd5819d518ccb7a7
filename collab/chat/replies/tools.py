"""The tools an agent may call (docs/architecture.md#a-agents): the built-ins, always
there, the HTTP tools staff registered (http_tools.py), enabled and attached to that
assistant, and the MCP servers' tools attached to it (mcp_tools.py).

`toolbox_for` is built in a sync context (it reads the database); `Toolbox.call` runs in
the event loop, its database work through `database_sync_to_async`. Every built-in is
authorised at call time against the asker: a room they are not a member of (or banned
from) is refused, and what they read goes through `Message.objects.visible_to`, so
another member's personal reply does not exist for them. A call has no timeout of its
own: the engine cuts it at `timeout_for(name)`. Results are plain text, capped; a
failure is a `ToolError`, whose message is shown to the model and the room.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from channels.db import database_sync_to_async
from django.contrib.auth.models import User

from collab.chat import calculator, shared
from collab.chat.errors import ClientError
from collab.chat.models import Assistant, Ban, Membership, Message, Room
from collab.chat.provider_models import BUILTIN_TOOL_NAMES
from collab.chat.replies import file_tools, http_tools, mcp_tools
from collab.chat.replies.http_tools import HttpTool
from collab.chat.replies.mcp_tools import McpTool
from collab.chat.replies.tool_spec import ToolError, ToolSpec
from collab.chat.services import history
from collab.chat.services.rooms import members_of

__all__ = ["BUILTIN_NAMES", "MAX_RESULT_CHARS", "ToolError", "ToolSpec", "Toolbox", "toolbox_for"]

MAX_RESULT_CHARS = 4000
MAX_ARGUMENT_CHARS = 20_000
BUILTIN_TIMEOUT_S = 10.0
SEARCH_RESULTS = 10
SEARCH_LINE_CHARS = 300
MAX_ID = 2**53  # a seq or id beyond any row (and within every database's integers)


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


BUILTINS: list[ToolSpec] = [
    ToolSpec(
        "search_room",
        "Search this room's messages (every word must match). Returns up to 10 matches, newest first, "
        "as '#seq author: text'.",
        _object({"query": {"type": "string", "description": "Words to find."}}, ["query"]),
        BUILTIN_TIMEOUT_S,
    ),
    ToolSpec(
        "read_message",
        "Read one message of this room in full, by its number (seq).",
        _object({"seq": {"type": "integer", "description": "The message's number."}}, ["seq"]),
        BUILTIN_TIMEOUT_S,
    ),
    ToolSpec(
        "calculate",
        "Compute an arithmetic expression: numbers, + - * / // % **, parentheses, sqrt abs round min max "
        "log sin cos, pi, e.",
        _object({"expression": {"type": "string", "description": "For example: (2 + 3) * sqrt(16)"}}, ["expression"]),
        BUILTIN_TIMEOUT_S,
    ),
    ToolSpec(
        "read_file",
        "Read a file attached to a message of this room, by its file id (the context and search_files give "
        "it): its text from `start` to `end` (characters; counted from the page's beginning with `page`), "
        "up to 3500 characters a call; an image's name, size and pixels.",
        _object(
            {
                "file": {"type": "integer", "description": "The file's id."},
                "page": {"type": "integer", "description": "A page, from 1 (a PDF's; other documents have one)."},
                "start": {"type": "integer", "description": "The first character to read (default 0)."},
                "end": {"type": "integer", "description": "Where to stop (default: the end, or the page's)."},
            },
            ["file"],
        ),
        BUILTIN_TIMEOUT_S,
    ),
    ToolSpec(
        "search_files",
        "Search the text and names of the files attached in this room. Returns up to 10 matches, best first, "
        "as 'file ID NAME, page P: snippet'.",
        _object({"query": {"type": "string", "description": "Words to find."}}, ["query"]),
        BUILTIN_TIMEOUT_S,
    ),
    ToolSpec("room_members", "This room's members, their roles, and who is online now.", _object({}, []), 5.0),
    ToolSpec("current_time", "The current date and time (UTC, ISO 8601).", _object({}, []), 1.0),
]
BUILTIN_NAMES = frozenset(s.name for s in BUILTINS)
if BUILTIN_NAMES != BUILTIN_TOOL_NAMES:  # the names a registered tool may not take (models)
    raise ImportError("replies/tools.py's built-in tools and provider_models.BUILTIN_TOOL_NAMES differ")

JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def cap(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    note = f"… (cut: {len(text):,} characters in all)"
    return text[: limit - len(note)] + note


def _type_ok(value: Any, expected: Any) -> bool:
    names = expected if isinstance(expected, list) else [expected]
    for name in names:
        kinds = JSON_TYPES.get(name) if isinstance(name, str) else None
        if kinds is None:
            return True  # a type this check does not know: the tool judges
        if isinstance(value, bool) and bool not in kinds:
            continue  # JSON's true is not a number
        if isinstance(value, kinds):
            return True
    return False


def parse_arguments(spec: ToolSpec, arguments: str) -> dict[str, Any]:
    """The call's arguments as an object that fits the spec's top-level schema."""
    if len(arguments) > MAX_ARGUMENT_CHARS:
        raise ToolError(f"{spec.name}: the arguments are too long ({len(arguments):,} characters)")
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as exc:
        raise ToolError(f"{spec.name}: the arguments are not valid JSON ({exc.msg} at character {exc.pos})") from None
    except RecursionError:
        raise ToolError(f"{spec.name}: the arguments are nested too deeply") from None
    if not isinstance(args, dict):
        raise ToolError(f"{spec.name}: the arguments must be a JSON object, not {type(args).__name__}")
    properties = spec.parameters.get("properties") or {}
    missing = [name for name in spec.parameters.get("required") or [] if name not in args]
    if missing:
        raise ToolError(f"{spec.name}: missing argument {', '.join(missing)}")
    if spec.parameters.get("additionalProperties") is False:
        unknown = [name for name in args if name not in properties]
        if unknown:
            known = ", ".join(properties) or "none"
            raise ToolError(f"{spec.name}: unknown argument {', '.join(unknown)[:200]} (it takes: {known})")
    for name, value in args.items():
        expected = properties.get(name, {}).get("type") if isinstance(properties.get(name), dict) else None
        if expected is not None and not _type_ok(value, expected):
            shown = " or ".join(expected) if isinstance(expected, list) else expected
            raise ToolError(f"{spec.name}: the argument {name} must be of type {shown}")
    return args


# --- the built-ins' database work (sync, called through database_sync_to_async) ---------------


def _check_member(here: Room, member_id: int | None) -> None:
    """The run's reader (its asker, or a personal run's recipient) must still be a member
    of the room, and not banned, at each call."""
    if member_id is None:
        return  # nobody to check (the asker's account is gone): this room's shared messages only
    member = Membership.objects.filter(room=here, user_id=member_id).exists()
    if not member or Ban.objects.filter(room=here, user_id=member_id).exists():
        raise ToolError("the asker is no longer a member here")


def _line(message: Message, limit: int) -> str:
    text = " ".join(message.text.split())
    line = f"#{message.seq} {message.author_name}: {text}"
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _search(here: Room, member_id: int | None, reader_id: int | None, reply_id: int, query: str) -> str:
    _check_member(here, member_id)
    room = here
    try:
        q = history.check_query(query)
    except ClientError as exc:
        raise ToolError(f"search_room: {exc.message}") from None
    found = history.search(room, reader_id or 0, q).exclude(pk=reply_id)[:SEARCH_RESULTS]
    lines = [_line(m, SEARCH_LINE_CHARS) for m in found]
    if not lines:
        return f"no messages match {q!r} in {room.slug}"
    return "\n".join(lines)


def _read(here: Room, member_id: int | None, reader_id: int | None, seq: int) -> str:
    _check_member(here, member_id)
    found = Message.objects.visible_to(reader_id or 0).filter(room=here, seq=seq) if 0 < seq < MAX_ID else None
    message = found.select_related("reply_to").first() if found is not None else None
    if message is None:
        return f"no message #{seq}"
    if message.deleted_at is not None:
        return f"#{seq} was deleted"
    when = message.created_at.astimezone(UTC).isoformat(timespec="seconds")
    head = f"#{message.seq} {message.author_name} ({message.role}, {when}"
    head += ", a reply to #" + str(message.reply_to.seq) if message.reply_to else ""
    head += ", still streaming" if message.status == Message.Status.STREAMING else ""
    return f"{head}):\n{message.text}"


def _members(here: Room, member_id: int | None, online: set[int] | None) -> str:
    _check_member(here, member_id)
    rows = members_of(here.pk, online)
    if online is None:
        lines = [f"{r['username']} ({r['role']})" for r in rows] + ["online: unknown"]
    else:
        lines = [f"{r['username']} ({r['role']}{', online' if r['online'] else ''})" for r in rows]
        lines.append(f"online now: {sum(1 for r in rows if r['online'])} of {len(rows)}")
    assistants = list(here.assistants.values_list("handle", flat=True))
    if assistants:
        lines.append("assistants: " + ", ".join(f"@{h}" for h in assistants))
    return "\n".join(lines)


# --- the toolbox --------------------------------------------------------------------------------


@dataclass
class Toolbox:
    """The tools of one agent run, in one room. They read what everyone who sees the run
    may see: a shared run, the room's shared messages only (its log reaches every member);
    a personal run (`/each`), those and its recipient's own personal replies."""

    room: Room
    asker_id: int | None  # who must still be a member: the asker, or a personal run's recipient
    reply_id: int
    reader_id: int | None = None  # a personal run's recipient; None: shared messages only
    specs: list[ToolSpec] = field(default_factory=list)
    http: dict[str, HttpTool] = field(default_factory=dict)
    mcp: dict[str, McpTool] = field(default_factory=dict)
    withheld: dict[str, str] = field(default_factory=dict)  # attached MCP tools not offered, and why

    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI `tools` parameter."""
        return [
            {"type": "function", "function": {"name": s.name, "description": s.description, "parameters": s.parameters}}
            for s in self.specs
        ]

    def spec(self, name: str) -> ToolSpec:
        for s in self.specs:
            if s.name == name:
                return s
        if name in self.withheld:
            raise ToolError(f"{name} is not offered: {self.withheld[name]}")
        known = ", ".join(s.name for s in self.specs)
        raise ToolError(f"no tool named {name[:64]!r} (the tools: {known})")

    def timeout_for(self, name: str) -> float:
        """How long the engine lets a call of `name` run (an unknown name fails at once anyway)."""
        return next((s.timeout_s for s in self.specs if s.name == name), BUILTIN_TIMEOUT_S)

    async def call(self, name: str, arguments: str) -> str:
        """The tool's result as text (at most MAX_RESULT_CHARS); a ToolError saying why not."""
        spec = self.spec(name)
        args = parse_arguments(spec, arguments)
        if name in self.http:
            return cap(await http_tools.post(self.http[name], args))
        if name in self.mcp:
            caller = mcp_tools.Caller(self.room, self.asker_id, self.reply_id)
            return cap(await mcp_tools.call(self.mcp[name], args, caller))
        return cap(await self._builtin(name, args))

    async def _builtin(self, name: str, args: dict[str, Any]) -> str:
        if name == "calculate":
            try:
                return calculator.calculate(args["expression"])
            except calculator.CalcError as exc:
                raise ToolError(f"calculate: {exc}") from None
        if name == "current_time":
            return datetime.now(UTC).isoformat(timespec="seconds")
        if name == "search_room":
            return await database_sync_to_async(_search)(
                self.room, self.asker_id, self.reader_id, self.reply_id, args["query"]
            )
        if name == "read_message":
            return await database_sync_to_async(_read)(self.room, self.asker_id, self.reader_id, args["seq"])
        if name == "read_file":
            where = (args["file"], args.get("page"), args.get("start"), args.get("end"))
            return await database_sync_to_async(self._file)(*where)
        if name == "search_files":
            return await database_sync_to_async(self._search_files)(args["query"])
        if name == "room_members":
            online: set[int] | None
            try:
                online = await shared.backend().online(self.room.pk)
            except shared.UNAVAILABLE:
                online = None
            return await database_sync_to_async(_members)(self.room, self.asker_id, online)
        raise ToolError(f"no tool named {name!r}")  # pragma: no cover (spec() knows every name)

    def _file(self, file_id: int, page: int | None, start: int | None, end: int | None) -> str:
        _check_member(self.room, self.asker_id)
        return file_tools.read_file(self.room, self.reader_id, file_id, page, start, end)

    def _search_files(self, query: str) -> str:
        _check_member(self.room, self.asker_id)
        return file_tools.search_files(self.room, self.reader_id, query)


def toolbox_for(assistant: Assistant, room: Room, asker: User | None, reply: Message) -> Toolbox:
    """The built-ins, and the enabled HTTP and MCP tools attached to this assistant (sync: reads
    the database). An MCP name equal to an HTTP tool's (staff may name one `a__b`) is left out."""
    attached = [t for t in http_tools.attached(assistant) if t.spec.name not in BUILTIN_NAMES]
    taken = BUILTIN_NAMES | {t.spec.name for t in attached}
    from_mcp = [t for t in mcp_tools.attached(assistant) if t.spec.name not in taken]
    return Toolbox(
        room=room,
        asker_id=reply.recipient_id or (asker.pk if asker is not None else None),
        reply_id=reply.pk,
        reader_id=reply.recipient_id,
        specs=[*BUILTINS, *(t.spec for t in attached), *(t.spec for t in from_mcp)],
        http={t.spec.name: t for t in attached},
        mcp={t.spec.name: t for t in from_mcp},
        withheld=mcp_tools.withheld(assistant),
    )
