"""A request body's size and time, limited while it is read: a `Content-Length` over the limit is
answered 413 before a byte of the body is read, and a chunked body is cut off (413) as soon as it
passes the limit. Without it, one 30 MB request was read, parsed and tokenised in full on the event
loop and stalled every other client (and /health) for ~18 s. A body not complete within `timeout`
seconds of the request's start is answered 408 and its connection closed: 60 clients that sent
headers and part of a body held their connections open indefinitely."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from headstart.serve.bodies import error_body

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: bodies of more than `limit` bytes, or not complete within `timeout`
    seconds, are refused with OpenAI's error shape; `count` (called with the path and the status)
    is told of each refusal (the server's /metrics)."""

    def __init__(self, app: Any, limit: int, count: Callable[..., None] = lambda path, status=413: None,
                 timeout: float = 30.0) -> None:  # fmt: skip
        self.app, self.limit, self.count, self.timeout = app, limit, count, timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline, state = loop.time() + self.timeout, {"read": False, "started": False, "late": False}

        async def timed() -> Message:
            """`receive`, with the body's deadline until its last part has come (a later wait, for
            the client's disconnect, is not limited). A late body is answered 408 here, and the app
            is told the client left (it stops reading; what it answers then is dropped)."""
            if state["read"] or state["late"]:
                return await receive() if state["read"] else {"type": "http.disconnect"}
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except asyncio.TimeoutError:  # noqa: UP041 - on Python 3.10 it is not TimeoutError
                state["late"] = True
                if not state["started"]:
                    state["started"] = True
                    await self.refuse(scope, send, 408)
                return {"type": "http.disconnect"}
            state["read"] = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def tracked(message: Message) -> None:
            if state["late"]:
                return  # the 408 is the answer
            state["started"] = state["started"] or message["type"] == "http.response.start"
            await send(message)

        await self._limited(scope, timed, tracked)

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
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

    async def refuse(self, scope: Scope, send: Send, status: int = 413) -> None:
        self.count(scope.get("path", ""), status)
        if status == 408:
            message = f"the request body did not arrive within {self.timeout:g} s (--body-timeout)"
            code = "request_timeout"
        else:
            mb = self.limit / 2**20
            message = f"the request body is larger than this server's limit of {mb:g} MiB (--max-body-mb)"
            code = "request_too_large"
        body = json.dumps(error_body(message, code=code)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})
