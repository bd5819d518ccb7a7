"""HTTP tools registered by staff (models.Tool; docs/architecture.md#a-agents): the call's
arguments are POSTed as JSON to the tool's URL, the response text is the result.

Only enabled tools attached to the assistant are offered. The key, when the tool names
an environment variable, is read at call time and sent as `Authorization: Bearer ...`;
it is never stored, logged or put in an error (a missing variable's error names the
variable only). The response is untrusted text: it is read up to a cap, decoded, and
only ever returned as a string (it cannot change the tools or the budgets).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import httpx2

from collab.chat.models import Assistant
from collab.chat.provider_env import key_variable_allowed
from collab.chat.replies.tool_spec import ToolError, ToolSpec

MAX_READ_BYTES = 64 * 1024  # read no more of a response than this (the result keeps tools.MAX_RESULT_CHARS)
# The engine cuts a call at the tool's timeout; the client's own is a backstop a little later.
BACKSTOP_S = 1.0


@dataclass(frozen=True)
class HttpTool:
    spec: ToolSpec
    url: str
    api_key_env: str


def attached(assistant: Assistant) -> list[HttpTool]:
    """The enabled tools attached to this assistant, as they are now (sync: reads the database)."""
    rows = assistant.tools.filter(enabled=True).order_by("name") if assistant.pk else []
    return [HttpTool(ToolSpec(t.name, t.description, t.parameters, t.timeout_s), t.url, t.api_key_env) for t in rows]


def _headers(tool: HttpTool) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "text/plain, application/json, */*"}
    name = tool.api_key_env
    if not name:
        return headers
    if not key_variable_allowed(name):
        raise ToolError(f"{tool.spec.name}: its key variable {name} is not an allowed key variable")
    key = os.environ.get(name)
    if not key:
        raise ToolError(f"{tool.spec.name}: its key variable {name} is not set on the server")
    headers["Authorization"] = f"Bearer {key}"
    return headers


async def post(tool: HttpTool, args: dict[str, Any]) -> str:
    """The response's text (cut), or a ToolError with the status or what went wrong."""
    name = tool.spec.name
    headers = _headers(tool)
    body = json.dumps(args, ensure_ascii=False).encode()
    timeout = httpx2.Timeout(tool.spec.timeout_s + BACKSTOP_S)
    try:
        async with (
            httpx2.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as client,
            client.stream("POST", tool.url, content=body, headers=headers) as response,
        ):
            data = b""
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) >= MAX_READ_BYTES:
                    break
            status = response.status_code
            encoding = response.encoding or "utf-8"
    except httpx2.TimeoutException:
        raise ToolError(f"{name}: no answer within {tool.spec.timeout_s:g} s") from None
    except httpx2.HTTPError as exc:
        raise ToolError(f"{name}: could not reach the tool ({type(exc).__name__})") from None
    data = data[:MAX_READ_BYTES]
    try:
        text = data.decode(encoding, errors="replace")
    except LookupError:
        text = data.decode("utf-8", errors="replace")
    if not 200 <= status < 300:
        detail = " ".join(text.split())[:200]
        raise ToolError(f"{name}: the tool answered HTTP {status}" + (f": {detail}" if detail else ""))
    return text  # Toolbox.call caps it (MAX_RESULT_CHARS), as every tool's result
