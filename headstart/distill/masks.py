"""Token ids and the assistant loss mask of a finished conversation, from the chat template alone.

The mask is found by rendering prefixes, not by searching for role markers, so it works for any
template: for each assistant message i, `prompt_ids(messages[:i], add_generation_prompt=True)` must
be a token prefix of the full conversation, and so must `prompt_ids(messages[:i + 1])`; the tokens in
between are the reply plus whatever the template closes the turn with. Of that closing text we keep
the end-of-turn token (the one the target emits to stop, e.g. ChatML's `<|im_end|>`) and drop what
follows it (ChatML's "\n"), which the target never generates.
"""

from __future__ import annotations

from collections.abc import Sequence

from headstart.errors import HeadstartError
from headstart.targets import Chat


def _check_prefix(full: list[int], prefix: list[int], what: str) -> None:
    if full[: len(prefix)] != prefix:
        raise HeadstartError(
            f"the chat template does not render {what} as a token prefix of the whole conversation",
            "use a target whose chat template renders turns append-only (ChatML, Llama-3, ...)",
        )


def assistant_spans(
    chat: Chat, messages: list[dict[str, str]], eos_ids: Sequence[int]
) -> tuple[list[int], list[tuple[int, int]]]:
    """(token ids of the whole conversation, [start, end) span of each assistant reply).

    A span ends just after the last end-of-turn id inside the assistant's rendered turn; when the
    template closes turns without one of `eos_ids`, the whole rendered turn is kept.
    """
    full = chat.prompt_ids(messages, add_generation_prompt=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = chat.prompt_ids(messages[:i], add_generation_prompt=True)
        through = chat.prompt_ids(messages[: i + 1], add_generation_prompt=False)
        _check_prefix(full, before, f"the prompt before assistant turn {i}")
        _check_prefix(full, through, f"assistant turn {i}")
        start, end = len(before), len(through)
        stops = [j for j in range(start, end) if full[j] in eos_ids]
        spans.append((start, stops[-1] + 1 if stops else end))
    return full, spans


def loss_mask(length: int, spans: list[tuple[int, int]]) -> list[int]:
    """1 on every token inside a span, else 0."""
    mask = [0] * length
    for start, end in spans:
        mask[start:end] = [1] * (end - start)
    return mask


def encode_conversation(
    chat: Chat, messages: list[dict[str, str]], eos_ids: Sequence[int]
) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) for a conversation whose assistant turns are the target's replies."""
    ids, spans = assistant_spans(chat, messages, eos_ids)
    return ids, loss_mask(len(ids), spans)
