"""The OpenAI API's response bodies as `headstart serve` writes them: whole responses, the
server-sent events of a stream (chat: a role chunk, content chunks, a finish chunk with an empty
delta, per choice; the usage chunk only when `stream_options.include_usage` asks for it), and
error bodies. One `created` per response: every chunk of a stream carries the same."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:  # fmt: skip
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


@dataclass(frozen=True)
class Reply:
    """What every body of one response shares."""

    rid: str
    model: str
    created: int
    chat: bool
    include_usage: bool = False  # streams: chunks carry "usage": null, and a usage chunk ends them

    def _head(self, stream: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if stream else "chat.completion") if self.chat else "text_completion"
        return {"id": self.rid, "object": kind, "created": self.created, "model": self.model}

    def whole(self, choices: list[dict[str, Any]], prompt: int, completion: int) -> dict[str, Any]:
        return {**self._head(False), "choices": choices, "usage": usage(prompt, completion)}

    def choice(self, index: int, text: str, finish: str, logprobs: Any = None) -> dict[str, Any]:
        """One choice of a whole response."""
        if self.chat:
            message = {"role": "assistant", "content": text}
            return {"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs}
        return {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}

    def chunk(self, index: int, text: str | None = None, finish: str | None = None,
              role: bool = False) -> dict[str, Any]:  # fmt: skip
        """One choice's event: its role (chat's first), a text delta, or its finish (empty delta)."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
        body = {**self._head(True), "choices": [choice]}
        if self.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, prompt: int, completion: int) -> dict[str, Any]:
        """The last event when include_usage is asked: no choices, the whole response's usage."""
        return {**self._head(True), "choices": [], "usage": usage(prompt, completion)}


class Refused(Exception):
    """A request answered with an OpenAI error body: its status, what went wrong and the fix, the
    field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error",
                503: "service_unavailable"}.get(self.status, "invalid_request_error")  # fmt: skip
        kind = "server_error" if self.status >= 500 and self.status != 503 else kind
        return error_body(self.message, kind, self.param, self.code)
