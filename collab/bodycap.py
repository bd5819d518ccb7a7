"""HTTP requests larger than any view of collab takes are refused before Django reads
their body (docs/architecture/files.md, "Intake").

Django's ASGI handler reads a request's whole body into a temporary file, on the event
loop, before any middleware or view runs: a 2 GB upload would be copied there in full
only to be refused. The largest body collab takes is one file of COLLAB["MAX_FILE_BYTES"]
and its multipart envelope: a request that declares more is answered 413
(`file.too_large`, JSON) without Django reading it; one without a declared length
(chunked) that sends more gets the same 413 as soon as it does, and Django is told the
client left. Under Daphne the server itself has received the body by then (Twisted reads
it before the application sees the request); nginx's `client_max_body_size`
(deploy/nginx.conf) is what refuses it at the door. Under uvicorn this is that door.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from collab.chat.files.handlers import ENVELOPE

Scope = dict[str, Any]


def limit() -> int:
    return int(settings.COLLAB["MAX_FILE_BYTES"]) + ENVELOPE


class BodyCap:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = limit()
        declared = next((v for k, v in scope.get("headers", ()) if k.lower() == b"content-length"), None)
        if declared is not None and (not declared.strip().isdigit() or int(declared) > cap):
            await self._refuse(send, cap)
            return
        received = 0

        async def counted() -> dict[str, Any]:
            nonlocal received
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:
                    # Nothing was answered yet (Django reads the body first): refuse, and
                    # tell Django the client left (RequestAborted: it answers nothing).
                    await self._refuse(send, cap)
                    return {"type": "http.disconnect"}
            return message

        await self.app(scope, counted, send)

    @staticmethod
    async def _refuse(send: Any, cap: int) -> None:
        megabytes = (cap - ENVELOPE) / (1 << 20)
        body = json.dumps(
            {"error": {"code": "file.too_large", "message": f"This file is larger than {megabytes:g} MB, the limit."}}
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
