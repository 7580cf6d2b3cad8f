"""logprobs.py without HTTP: the scoring forward is the target's own log-softmax, a function of
the tokens alone, and the two OpenAI shapes it is written in."""

from __future__ import annotations

import pytest
import torch

from headstart.serve.logprobs import Pieces, chat_logprobs, completion_logprobs, score


@pytest.fixture(scope="module")
def target(tiny_llama):
    from headstart.target import load_target

    return load_target(str(tiny_llama))


def test_score_is_the_targets_log_softmax_and_repeats_to_the_bit(target):
    ids = [5, 70, 80, 90, 100, 110, 3, 4]
    with torch.no_grad():
        expected = target.model(torch.tensor([ids])).logits[0].log_softmax(-1)  # (T, V)
    whole = score(target, ids, 0, 3)
    assert whole.tokens == ids and whole.logprobs[0] is None and whole.top[0] == []
    for at in range(1, len(ids)):
        assert whole.logprobs[at] == pytest.approx(expected[at - 1, ids[at]].item(), abs=1e-5)
        best = expected[at - 1].topk(3)
        assert [i for i, _ in whole.top[at]] == best.indices.tolist()
    tail = score(target, ids, 5, 0)
    assert tail.tokens == ids[5:] and tail.top == [[], [], []]
    assert tail.logprobs == pytest.approx(whole.logprobs[5:], abs=1e-5)
    assert score(target, ids, 5, 0) == tail  # the same tokens, the same bits


def test_the_openai_shapes(target):
    ids = target.tokenizer("Hi!")["input_ids"]  # byte by byte
    scored = score(target, ids, 0, 2)
    pieces = Pieces(target.tokenizer)
    legacy = completion_logprobs(scored, pieces)
    assert legacy["tokens"] == ["H", "i", "!"] and legacy["text_offset"] == [0, 1, 2]
    assert legacy["top_logprobs"][0] is None and legacy["token_logprobs"][0] is None
    for at in (1, 2):  # the top two, and the chosen token always
        top = legacy["top_logprobs"][at]
        assert legacy["tokens"][at] in top and 2 <= len(top) <= 3
        assert max(top.values()) == scored.top[at][0][1]
    chat = chat_logprobs(score(target, ids, 1, 2), pieces)
    assert [e["token"] for e in chat["content"]] == ["i", "!"]
    assert chat["content"][0]["bytes"] == [105] and len(chat["content"][0]["top_logprobs"]) == 2
