"""Directives in a request's last ``user`` message that shape that one request, as the
model name's ``+SPEC`` parts shape every request of an assistant (README, "Directives"):

- ``{{hold}}`` -- a long reply at a slow, steady pace: HOLD_TOKENS tokens, at most
  HOLD_TPS a second (the server's tps when lower): a reply still streaming whenever a
  test acts on it, until its client leaves. A later request of the same conversation
  whose last user message has no ``{{hold}}`` (a steered reply's next request, whose
  last turn is the note) is a reply of the usual length.
- ``{{fault SPEC}}`` -- SPEC as in a model name (``500``, ``quota``, ``drop@3``,
  ``stall@0``, ...) for this request alone; a SPEC that names no fault is a 400.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .config import ModelSpec, parse_model
from .text import _content_text

__all__ = ["HOLD_TOKENS", "HOLD_TPS", "Shape", "shape_of"]

HOLD_TOKENS = 20_000
HOLD_TPS = 20.0
_DIRECTIVE = re.compile(r"\{\{\s*(hold|fault\s+([^\s{}]+))\s*\}\}")


@dataclasses.dataclass(frozen=True)
class Shape:
    hold: bool = False
    fault: ModelSpec | None = None  # the request's fault, instead of its model name's


NONE = Shape()


def shape_of(messages: Sequence[Mapping[str, Any]]) -> Shape:
    """The directives of the request's last user message; ValueError for a bad SPEC."""
    last = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    text = _content_text(last.get("content")) if last is not None else ""
    if "{{" not in text:
        return NONE  # the common case: no directive is even looked for
    hold, fault = False, None
    for found in _DIRECTIVE.finditer(text):
        if found.group(1) == "hold":
            hold = True
        else:
            fault = parse_model("sim+" + found.group(2))
            if fault.fault == "none":
                raise ValueError(f"{{{{fault {found.group(2)}}}}} names no fault")
    return Shape(hold, fault)
