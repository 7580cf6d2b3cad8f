"""Row shapes -> conversations to regenerate: the user turns (and any system message) of a row.

Supported shapes (auto-detected per row, or forced with --shape):
    sharegpt   conversations: [{from: human|gpt|system, value}]
    messages   messages: [{role: user|assistant|system, content}]     (OpenAI, UltraChat-200k)
    ultrachat  data: [user, assistant, user, ...]                     (UltraChat's original files)
    alpaca     instruction, input, output
    mtbench    turns: [str, ...]
    prompt     prompt: str        text  text: str
By default the target writes every reply itself, turn by turn; the data's own assistant turns are
kept in `Conversation.replies` for `--engine dataset` (train on the replies people already have).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SHAREGPT_USER = {"human", "user"}
SHAREGPT_SYSTEM = {"system"}
SHAREGPT_ASSISTANT = {"gpt", "assistant", "model", "bot", "chatgpt"}


@dataclass(frozen=True)
class Conversation:
    """User turns to answer in order, with an optional system message taken from the row."""

    turns: tuple[str, ...]
    system: str | None = None
    replies: tuple[str | None, ...] = ()
    """The data's own reply after each user turn (None where the row has none), for
    `--engine dataset`; empty for prompt-only rows."""

    @property
    def key(self) -> str:
        """A content hash of the row (turns, system, replies): what resume checks, so an edited
        source is noticed instead of silently shifting which rows count as done."""
        import hashlib
        import json

        text = json.dumps([self.turns, self.system, self.replies], ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class Skip(Exception):
    """A row that cannot become a conversation; `reason` is counted in the summary."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def detect_shape(row: dict[str, Any]) -> str:
    if "conversations" in row:
        return "sharegpt"
    if "messages" in row:
        return "messages"
    if "instruction" in row:
        return "alpaca"
    if "data" in row and isinstance(row["data"], list):
        return "ultrachat"
    if "turns" in row:
        return "mtbench"
    if "prompt" in row:
        return "prompt"
    if "text" in row:
        return "text"
    raise Skip("unknown row shape")


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise Skip("non-string turn")
    if not value.strip():
        raise Skip("empty turn")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\\ud800" is valid JSON): no tokenizer takes it
        raise Skip("not valid Unicode (a lone surrogate)") from None
    return value


def _from_dicts(items: Any, role_key: str, text_key: str) -> Conversation:
    if not isinstance(items, list) or not items:
        raise Skip("empty conversation")
    system, turns, replies = None, [], []
    for item in items:
        if not isinstance(item, dict) or role_key not in item:
            raise Skip("malformed turn")
        role = str(item[role_key]).lower()
        if role in SHAREGPT_SYSTEM:
            system = _text(item.get(text_key))
        elif role in SHAREGPT_USER:
            turns.append(_text(item.get(text_key)))
            replies.append(None)
        elif role in SHAREGPT_ASSISTANT and turns and replies[-1] is None:
            value = item.get(text_key)
            replies[-1] = value if isinstance(value, str) and value.strip() else None
    if not turns:
        raise Skip("no user turn")
    return Conversation(tuple(turns), system, tuple(replies))


def _from_value(value: Any) -> Conversation:
    """A column picked with --field: a string, a list of strings, or a list of turn dicts."""
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        keys = set(value[0])
        return (
            _from_dicts(value, "from", "value") if "from" in keys else _from_dicts(value, "role", "content")
        )
    if isinstance(value, list):
        if not value:
            raise Skip("empty conversation")
        return Conversation(tuple(_text(v) for v in value))
    return Conversation((_text(value),))


def to_conversation(row: dict[str, Any], shape: str = "auto", field: str | None = None) -> Conversation:
    """The conversation in `row`; raises Skip with a countable reason when there is none."""
    if field is not None:
        if field not in row:
            raise Skip(f"missing field '{field}'")
        return _from_value(row[field])
    if shape == "auto":
        shape = detect_shape(row)
    if shape == "sharegpt":
        return _from_dicts(row.get("conversations"), "from", "value")
    if shape == "messages":
        return _from_dicts(row.get("messages"), "role", "content")
    if shape == "alpaca":
        instruction = _text(row.get("instruction"))
        extra = row.get("input")
        if extra is not None and not isinstance(extra, str):
            raise Skip("non-string turn")
        output = row.get("output")
        reply = output if isinstance(output, str) and output.strip() else None
        return Conversation(
            (f"{instruction}\n\n{extra}" if extra and extra.strip() else instruction,), None, (reply,)
        )
    if shape == "ultrachat":
        data = row.get("data")
        if not isinstance(data, list) or not data:
            raise Skip("empty conversation")
        users = tuple(_text(t) for t in data[0::2])
        answers = [t if isinstance(t, str) and t.strip() else None for t in data[1::2]]
        return Conversation(users, None, tuple(answers + [None] * (len(users) - len(answers))))
    if shape == "mtbench":
        turns = row.get("turns")
        if not isinstance(turns, list) or not turns:
            raise Skip("empty conversation")
        return Conversation(tuple(_text(t) for t in turns))
    if shape in ("prompt", "text"):
        if shape not in row:
            raise Skip(f"missing field '{shape}'")
        return Conversation((_text(row[shape]),))
    raise Skip("unknown row shape")
