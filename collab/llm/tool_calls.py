"""A model's tool calls, assembled from their streamed fragments (OpenAI function calling
and the dialects that stream it otherwise)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call the model asks for (OpenAI function calling). `arguments` is the
    JSON text as the model wrote it, unchecked (it may be invalid): the caller parses it.
    Yielded once the stream's finish_reason came, after the reply's last text piece and
    before its `Usage`."""

    id: str
    name: str
    arguments: str


class _Call:
    """A tool call being assembled from its streamed fragments."""

    __slots__ = ("id", "name", "parts")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.parts: list[str] = []


class Calls:
    """The tool calls of one streamed answer, as their fragments come."""

    def __init__(self) -> None:
        self._calls: list[_Call] = []
        self._by_index: dict[int, _Call] = {}

    def __bool__(self) -> bool:
        return bool(self._calls)

    def add(self, fragments: Any) -> None:
        """Add one delta's `tool_calls` fragments. OpenAI: the first fragment of a call
        carries `index`, `id`, `type`, `function.name`; the later ones `index` and a piece
        of `function.arguments`, and calls may interleave by index. Dialects read the same
        way: `id` (and `name`) repeated on every fragment, a whole call in one fragment
        (Ollama, some vLLM), `arguments` as an object, no `index` (a fragment without one
        continues the call with its `id`, else the last call), several calls under one
        index with different ids (each its own call)."""
        if not isinstance(fragments, list):
            return
        calls, by_index = self._calls, self._by_index
        for fragment in fragments:
            if not isinstance(fragment, dict):
                continue
            ident = fragment.get("id") or ""
            index = fragment.get("index")
            if isinstance(index, int):
                call = by_index.get(index)
            elif ident:
                call = next((c for c in calls if c.id == ident), None)
            else:
                call = calls[-1] if calls else None
            if call is None or (ident and call.id and call.id != ident):
                call = _Call()
                calls.append(call)
                if isinstance(index, int):
                    by_index[index] = call
            if ident and not call.id:
                call.id = str(ident)
            function = fragment.get("function")
            if isinstance(function, dict):
                name = function.get("name")
                if name and not call.name:
                    call.name = str(name)
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    call.parts.append(arguments)
                elif arguments is not None:
                    call.parts.append(json.dumps(arguments, ensure_ascii=False))

    def done(self) -> list[ToolCall]:
        """The assembled calls in the order they began; one without a name is dropped,
        one without an id gets `call_<n>` (the model is answered by id)."""
        return [ToolCall(c.id or f"call_{n}", c.name, "".join(c.parts)) for n, c in enumerate(self._calls) if c.name]
