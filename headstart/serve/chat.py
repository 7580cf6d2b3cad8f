"""A chat request's prompt: its messages (tool calls and tool results included) and tool
definitions rendered through the target's own chat template, as transformers'
`apply_chat_template(messages, tools=...)` renders them. What the template does not render is
refused, never dropped in silence: a template that ignores `tools`, tool messages or an
assistant's tool calls (SmolLM2's ChatML, for one) gives the same text with them and without."""

from __future__ import annotations

import json
from typing import Any

from headstart.errors import HeadstartError
from headstart.serve.bodies import Refused
from headstart.serve.protocol import ChatRequest, Message


def utf8(text: str, where: str) -> str:
    """JSON can carry a lone surrogate ("\\ud800"), which no tokenizer takes: a 400, not a 500."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise Refused(400, f"{where} is not valid Unicode text ({err.reason} at character {err.start})",
                      where) from None  # fmt: skip
    return text


def message_dict(message: Message, where: str) -> dict[str, Any]:
    """A message as chat templates read it (OpenAI's developer role is the system role)."""
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role,
                           "content": utf8(message.text(), where)}  # fmt: skip
    if message.name is not None:
        out["name"] = message.name
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        # OpenAI sends arguments as a JSON string; templates (and transformers' docs) expect a
        # dict, as vLLM passes them: parsed when they parse to an object
        out["tool_calls"] = [{"id": call.id, "type": "function",
                              "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)}}
                             for call in message.tool_calls]  # fmt: skip
    return out


def _arguments(value: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if isinstance(parsed, dict) else value


def chat_prompt(chat: Any, body: ChatRequest) -> list[int]:
    """The prompt's token ids; a 400 naming the field the template cannot render."""
    messages = [message_dict(m, f"messages.{i}.content") for i, m in enumerate(body.messages)]
    tools = [tool.model_dump(exclude_unset=True) for tool in body.tools] if body.tools else None
    text = _render(chat, messages, tools)
    if tools and _render(chat, messages, None, quiet=True) == text:
        raise Refused(400, "this target's chat template ignores `tools` (it renders no tool definitions); "
                      "describe the tools in a system message instead", "tools")  # fmt: skip
    if any(m["role"] == "tool" for m in messages):
        kept = [m for m in messages if m["role"] != "tool"]
        if _render(chat, kept, tools, quiet=True) == text:
            raise Refused(400, "this target's chat template ignores messages of role 'tool'; "
                          "send the tool's result as a user message instead", "messages")  # fmt: skip
    if any("tool_calls" in m for m in messages):
        plain = [{k: v for k, v in m.items() if k != "tool_calls"} for m in messages]
        if _render(chat, plain, tools, quiet=True) == text:
            raise Refused(400, "this target's chat template ignores an assistant message's tool_calls; "
                          "send the call as the message's content instead", "messages")  # fmt: skip
    return chat.encode_rendered(text)


def _render(chat: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
            quiet: bool = False) -> str | None:  # fmt: skip
    """The template's text; a template error is a 400 (`quiet`: None, for a comparison only)."""
    try:
        return chat.render(messages, tools=tools)
    except HeadstartError as err:
        if quiet:
            return None
        raise Refused(400, err.what, "messages") from None
