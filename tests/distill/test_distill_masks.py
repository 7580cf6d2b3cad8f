"""Loss masks: exactly the assistant reply tokens plus the end-of-turn token, on ChatML templates."""

from __future__ import annotations

import pytest

from headstart.distill.masks import encode_conversation
from headstart.targets import Chat

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Count to 3."},
    {"role": "assistant", "content": "1, 2, 3."},
]


def _masked_texts(tokenizer, ids, mask):
    """Decoded runs of masked tokens, in order."""
    runs, current = [], []
    for tok, bit in zip(ids, mask, strict=True):
        if bit:
            current.append(tok)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tokenizer.decode(run) for run in runs]


def _check(tokenizer, eos_ids):
    chat = Chat(tokenizer)
    ids, mask = encode_conversation(chat, CONVERSATION, eos_ids)
    assert ids == chat.prompt_ids(CONVERSATION, add_generation_prompt=False)
    assert _masked_texts(tokenizer, ids, mask) == ["Hello! How can I help?<|im_end|>", "1, 2, 3.<|im_end|>"]
    # the token after each masked run is the template's "\n", never masked
    for i in range(1, len(ids)):
        if mask[i - 1] and not mask[i]:
            assert tokenizer.decode([ids[i]]) == "\n"
    return ids, mask


def test_mask_on_tiny_chatml_template():
    from tiny import make_tokenizer

    tokenizer = make_tokenizer()
    ids, mask = _check(tokenizer, eos_ids=(tokenizer.convert_tokens_to_ids("<|im_end|>"),))
    assert (
        mask[-1] == 0 and sum(mask) == len("Hello! How can I help?") + len("1, 2, 3.") + 2
    )  # byte-level: 1 token per byte


def test_mask_without_an_end_of_turn_id_keeps_the_whole_turn():
    from tiny import make_tokenizer

    chat = Chat(make_tokenizer())
    ids, mask = encode_conversation(chat, CONVERSATION[:3], eos_ids=())
    assert (
        chat.tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
        == "Hello! How can I help?<|im_end|>\n"
    )


@pytest.mark.slow
def test_mask_on_smollm2_real_template():
    from headstart.targets import load_target

    target = load_target("smollm2")
    ids, mask = _check(target.tokenizer, target.eos_token_ids)
    # without a system message, SmolLM2's template inserts its default one: still not masked
    ids2, mask2 = encode_conversation(target.chat, CONVERSATION[1:3], target.eos_token_ids)
    assert "You are a helpful AI assistant" in target.tokenizer.decode(ids2)
    assert _masked_texts(target.tokenizer, ids2, mask2) == ["Hello! How can I help?<|im_end|>"]
