"""A request body's size, limited while it is read: a `Content-Length` over the limit is answered
413 before a byte of the body is read, and a chunked body is cut off (413) as soon as it passes
the limit. Without it, one 30 MB request was read, parsed and tokenised in full on the event loop
and stalled every other client (and /health) for ~18 s."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from headstart.serve.bodies import error_body

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: bodies of more than `limit` bytes are refused with OpenAI's error shape;
    `count` (called with the path) is told of each refusal (the server's /metrics)."""

    def __init__(self, app: Any, limit: int, count: Callable[[str], None] = lambda path: None) -> None:
        self.app, self.limit, self.count = app, limit, count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit():
            if int(declared) > self.limit:
                await self.refuse(scope, send)  # before the body is read
            else:  # the server reads no more than declared: it streams through as it is
                await self.app(scope, receive, send)
            return
        # no length given (chunked): read it here, up to the limit, then hand it on whole. An error
        # raised inside the app's own read would come back as FastAPI's 400, not a 413
        messages: list[Message] = []
        seen = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            seen += len(message.get("body", b""))
            if seen > self.limit:
                await self.refuse(scope, send)
                return
            if not message.get("more_body", False):
                break
        replay = iter(messages)

        async def buffered() -> Message:
            return next(replay, None) or await receive()

        await self.app(scope, buffered, send)

    async def refuse(self, scope: Scope, send: Send) -> None:
        self.count(scope.get("path", ""))
        mb = self.limit / 2**20
        message = f"the request body is larger than this server's limit of {mb:g} MiB (--max-body-mb)"
        body = json.dumps(error_body(message, code="request_too_large")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})
