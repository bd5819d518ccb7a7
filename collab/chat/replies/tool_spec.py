"""What an agent's tool is (its name, description, JSON schema, timeout) and how a call
fails: shared by the built-in tools (tools.py) and the HTTP tools staff register
(http_tools.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collab.chat.agent import ToolFailed


class ToolError(ToolFailed):
    """Why a call failed: its message is shown to the model and the room (never a secret)."""


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]
    timeout_s: float
