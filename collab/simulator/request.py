"""A chat-completion request, parsed and checked as the OpenAI API checks it (errors are
OpenAI-shaped: ``{"error": {"message", "type", "param", "code"}}``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any

from .config import ModelSpec, parse_model

if TYPE_CHECKING:
    from .tools import Script

__all__ = ["Completion", "HTTPError", "check_auth", "dumps", "fault_error", "parse_completion", "read_body"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class HTTPError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})
        self.headers = list(headers)


@dataclasses.dataclass
class Completion:
    model: str
    spec: ModelSpec
    messages: list[dict[str, Any]]
    stream: bool
    include_usage: bool
    max_tokens: int | None
    tools: list[dict[str, Any]] | None = None  # function-calling schemas, as sent
    tool_choice: str | None = None  # "none": answer in text whatever the tools (only the string forms)
    script: Script | None = None  # the scripted reply (tools.script_for), set by the app
    reply_tokens: int | None = None  # its text's length, when not the server's (a {{hold}}: directives.py)
    proof: list[str] | None = None  # the tokens of the line proving what it held of files (files.py)


def fault_error(fault: str) -> HTTPError | None:
    """The error status a fault answers with instead of a reply (None: a reply)."""
    if fault == "429":
        return HTTPError(
            429,
            "Rate limit reached for requests (simulated). Please try again in 1s.",
            type_="rate_limit_exceeded",
            code="rate_limit_exceeded",
            headers=[(b"retry-after", b"1")],
        )
    if fault == "quota":
        return HTTPError(
            429,
            "You exceeded your current quota, please check your plan and billing details (simulated).",
            type_="insufficient_quota",
            code="insufficient_quota",
        )
    if fault == "500":
        return HTTPError(
            500,
            "The server had an error while processing your request (simulated).",
            type_="server_error",
        )
    return None


def check_auth(scope: Scope, expected: bytes | None) -> None:
    """With an API key set (``expected``: its ``Authorization`` header value), a request must carry it."""
    if expected is None:
        return
    for name, value in scope["headers"]:
        if name == b"authorization" and value == expected:
            return
    raise HTTPError(
        401,
        "Incorrect API key provided. You can find your API key at the simulator's --api-key.",
        code="invalid_api_key",
    )


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The request's body (413 past ``limit`` bytes); None if the client left first."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise HTTPError(413, f"Request body too large (limit {limit} bytes)")
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise HTTPError(413, f"Request body too large (limit {limit} bytes)")
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def _check_tool_turns(messages: list[dict[str, Any]]) -> None:
    """OpenAI's rules for tool turns, as its API answers them (400): an assistant message
    with `tool_calls` is followed by one `tool` message per call id, before anything else;
    a `tool` message answers such a call."""
    waiting: set[str] = set()  # call ids of the last assistant turn not answered yet
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in waiting:
                raise HTTPError(
                    400,
                    f"Invalid parameter: messages[{i}] with role 'tool' must be a response to a preceding "
                    "message with 'tool_calls'.",
                    param=f"messages[{i}]",
                )
            waiting.discard(call_id)
            continue
        if waiting:
            raise HTTPError(
                400,
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'. The following tool_call_ids did not have response messages: {sorted(waiting)}",
                param=f"messages[{i}]",
            )
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls:
            if not isinstance(calls, list):
                raise HTTPError(400, f"messages[{i}].tool_calls must be an array.", param=f"messages[{i}]")
            waiting = {c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)}
    if waiting:
        raise HTTPError(
            400, f"The following tool_call_ids did not have response messages: {sorted(waiting)}", param="messages"
        )


def parse_completion(body: bytes) -> Completion:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HTTPError(400, f"We could not parse the JSON body of your request: {exc}") from None
    if not isinstance(data, dict):
        raise HTTPError(400, "The request body must be a JSON object.")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise HTTPError(400, "you must provide a model parameter", param="model")
    try:
        spec = parse_model(model)
    except ValueError as exc:
        raise HTTPError(400, str(exc), code="model_not_found", param="model") from None
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise HTTPError(400, "'messages' must be a non-empty array.", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise HTTPError(400, f"messages[{i}] must be an object with a string 'role'.", param=f"messages[{i}]")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise HTTPError(
                400,
                f"messages[{i}].content must be a string or an array.",
                param=f"messages[{i}].content",
            )
    _check_tool_turns(messages)
    stream = data.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise HTTPError(400, "'stream' must be a boolean.", param="stream")
    include_usage = False
    options = data.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise HTTPError(400, "'stream_options' must be an object.", param="stream_options")
        if not stream:
            raise HTTPError(
                400,
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                param="stream_options",
            )
        include_usage = options.get("include_usage") is True
    max_tokens: int | None = None
    for key in ("max_completion_tokens", "max_tokens"):
        value = data.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise HTTPError(400, f"'{key}' must be a positive integer.", param=key)
        max_tokens = value if max_tokens is None else min(max_tokens, value)
    tools = data.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise HTTPError(400, "'tools' must be an array of objects.", param="tools")
    choice = data.get("tool_choice")
    if choice is not None and not isinstance(choice, (str, dict)):
        raise HTTPError(400, "'tool_choice' must be a string or an object.", param="tool_choice")
    tool_choice = choice if isinstance(choice, str) else None
    return Completion(model, spec, messages, stream, include_usage, max_tokens, tools, tool_choice)
