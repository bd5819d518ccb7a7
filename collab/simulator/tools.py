"""Scripted function calling: the simulated model as an agent's model (README, "Tool calls
(agents)").

Directives in the request's last user message script the replies:

- ``{{tool NAME ARGS}}`` -- one tool call; ``ARGS`` goes out verbatim as the call's
  ``arguments`` string (invalid JSON too), ``{}`` when left out. Several in a round are
  parallel calls (indexes 0, 1, ...).
- ``{{next}}`` -- separates rounds.
- ``{{replan}}`` -- the first evaluation asks for a new plan.

With ``tools`` in the request, round ``r`` (the number of assistant messages with
``tool_calls`` after that user message) answers with its calls while there is one, then
the plain simulated text. Without ``tools``, a request whose last message starts with
"Evaluate" gets a verdict, "ON PLAN: ..." or "REPLAN: ..."; any other is the plain text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .text import _content_text, base_model, simulated_tokens

__all__ = ["Call", "Script", "parse_directives", "script_for"]

# `{{next}}`, `{{replan}}`, or the start of `{{tool NAME ...}}` (its ARGS are read by hand).
_START = re.compile(r"\{\{\s*(?:(next|replan)\s*\}\}|tool\s+([^\s{}]+))")
# The closing `}}` of ARGS that are not JSON: the last two of a run of braces, so that
# `{{tool f {"a": 1}}}` closes after the object.
_CLOSE = re.compile(r"\}\}(?!\})")
# How arguments are cut into streamed fragments (token-like, like the reply's text);
# every character falls in some piece, so the pieces join back to the exact string.
_FRAGMENT = re.compile(r" ?[A-Za-z_]+| ?\d+| ?[^\sA-Za-z_\d]+|\s+")
_DECODER = json.JSONDecoder()
VERDICT_WORDS = 9  # the short text after "ON PLAN:" / "REPLAN:"


@dataclass(frozen=True)
class Call:
    """One scripted tool call, as streamed: its arguments in fragments."""

    id: str
    name: str
    fragments: tuple[str, ...]

    @property
    def arguments(self) -> str:
        return "".join(self.fragments)


@dataclass(frozen=True)
class Directives:
    rounds: tuple[tuple[tuple[str, str], ...], ...]  # each round's (name, arguments)
    replan: bool


def _read_arguments(text: str, p: int) -> tuple[str, int] | None:
    """ARGS from ``text[p:]`` and the position after the closing ``}}``; None if unclosed."""
    while p < len(text) and text[p].isspace():
        p += 1
    if text.startswith("}}", p):
        return "", p + 2
    if text[p : p + 1] in ("{", "["):
        try:
            _, end = _DECODER.raw_decode(text, p)
        except ValueError:
            pass
        else:
            q = end
            while q < len(text) and text[q].isspace():
                q += 1
            if text.startswith("}}", q):
                return text[p:end], q + 2
    close = _CLOSE.search(text, p)
    if close is None:
        return None
    return text[p : close.start()].rstrip(), close.end()


def parse_directives(text: str) -> Directives:
    """The rounds of tool calls (empty rounds dropped) and the replan flag in ``text``."""
    rounds: list[list[tuple[str, str]]] = [[]]
    replan = False
    pos = 0
    while (m := _START.search(text, pos)) is not None:
        pos = m.end()
        if m.group(1) == "next":
            rounds.append([])
        elif m.group(1) == "replan":
            replan = True
        else:
            read = _read_arguments(text, pos)
            if read is None:
                continue  # never closed: not a directive
            arguments, pos = read
            rounds[-1].append((m.group(2), arguments or "{}"))
    return Directives(tuple(tuple(r) for r in rounds if r), replan)


@dataclass(frozen=True)
class Script:
    """A scripted reply, in place of the simulated text. ``pieces`` are what is streamed
    one per token slot: a verdict's text tokens, or, for a tool round, each event's
    ``delta`` object as JSON (a call's first names it, the next carry its arguments)."""

    pieces: tuple[str, ...]
    calls: tuple[Call, ...] = ()
    finish_reason: str = "stop"

    def tool_calls(self, n: int) -> list[dict[str, Any]]:
        """The calls of a non-streamed reply cut after ``n`` pieces (``max_tokens``)."""
        out: list[dict[str, Any]] = []
        for call in self.calls:
            if n <= 0:
                break
            fragments = call.fragments[: n - 1]
            n -= 1 + len(call.fragments)
            function = {"name": call.name, "arguments": "".join(fragments)}
            out.append({"id": call.id, "type": "function", "function": function})
        return out


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def tool_round(r: int, calls: Sequence[tuple[str, str]]) -> Script:
    """Round ``r``'s calls (ids ``call_<r>_<i>``) and their stream of deltas."""
    scripted = tuple(
        Call(f"call_{r}_{i}", name, tuple(_FRAGMENT.findall(arguments))) for i, (name, arguments) in enumerate(calls)
    )
    pieces: list[str] = []
    for i, call in enumerate(scripted):
        first = {"index": i, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        pieces.append(_dumps({"tool_calls": [first]}))
        pieces += [_dumps({"tool_calls": [{"index": i, "function": {"arguments": f}}]}) for f in call.fragments]
    return Script(tuple(pieces), scripted, "tool_calls")


def _is_evaluation(message: Mapping[str, Any]) -> bool:
    return _content_text(message.get("content")).lstrip().startswith("Evaluate")


def script_for(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None, seed: int, model: str
) -> Script | None:
    """The scripted reply to a request, or None for the plain simulated text."""
    if not tools and not (messages and _is_evaluation(messages[-1])):
        return None  # the common case: no directive is even looked for
    # The task: the last user message (an "Evaluate" prompt sent as one is not it).
    users = [i for i, m in enumerate(messages) if m.get("role") == "user" and not _is_evaluation(m)]
    at = users[-1] if users else None
    task = _content_text(messages[at].get("content")) if at is not None else ""
    directives = parse_directives(task)
    if tools:
        if at is None:
            return None
        r = sum(1 for m in messages[at + 1 :] if m.get("role") == "assistant" and m.get("tool_calls"))
        return tool_round(r, directives.rounds[r]) if r < len(directives.rounds) else None
    revised = any("Revised plan" in _content_text(m.get("content")) for m in messages)  # one replan only
    head = ["REPLAN", ":"] if directives.replan and not revised else ["ON", " PLAN", ":"]
    words = simulated_tokens(messages, seed, base_model(model) + "-verdict", VERDICT_WORDS)
    return Script((*head, " " + words[0], *words[1:]))
