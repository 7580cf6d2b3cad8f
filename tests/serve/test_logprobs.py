"""logprobs.py without HTTP: the scoring forward is the target's own log-softmax, a function of
the tokens alone, and the two OpenAI shapes it is written in."""

from __future__ import annotations

import pytest
import torch

from headstart.serve.logprobs import Pieces, chat_logprobs, completion_logprobs, score


@pytest.fixture(scope="module")
def target(tiny_llama):
    from headstart.targets import load_target

    return load_target(str(tiny_llama))


@pytest.mark.parametrize("chunk", [256, 3])  # one chunk; chunks over the KV cache (the logits held at once)
def test_score_is_the_targets_log_softmax_and_repeats_to_the_bit(target, chunk, monkeypatch):
    import headstart.serve.logprobs as logprobs

    monkeypatch.setattr(logprobs, "CHUNK", chunk)
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


def test_bytes_are_each_tokens_own_and_join_to_the_text(target):
    """A token holding part of a character: its `bytes` are its own share of the UTF-8 (joined,
    they give the text back), its text is written `bytes:\\xNN` as OpenAI writes it, and the
    completions offsets count characters of the text (no drift past a split character)."""
    text = "Emoji: 😀 and café"
    ids = target.tokenizer(text, add_special_tokens=False)["input_ids"]
    scored = score(target, ids, 0, 2)
    pieces = Pieces(target.tokenizer)
    chat = chat_logprobs(score(target, ids, 1, 2), pieces)
    joined = bytes(b for e in chat["content"] for b in e["bytes"])
    assert bytes(pieces.raw(ids[0])) + joined == text.encode("utf-8")
    assert any(e["token"].startswith("bytes:\\x") for e in chat["content"])  # the emoji's pieces
    for e in (alt for entry in chat["content"] for alt in [entry, *entry["top_logprobs"]]):
        raw = bytes(e["bytes"])
        if e["token"].startswith("bytes:"):  # part of a character: its bytes, written out
            assert e["token"] == "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        else:
            assert raw == e["token"].encode("utf-8")
    legacy = completion_logprobs(scored, pieces)
    tokens, offsets = legacy["tokens"], legacy["text_offset"]
    for at, (token, offset) in enumerate(zip(tokens, offsets, strict=True)):
        if not token.startswith("bytes:"):
            assert text[offset : offset + len(token)] == token, (at, token, offset)
    emoji = [i for i, token in enumerate(tokens) if token.startswith("bytes:")][:4]  # é follows
    assert emoji == [7, 8, 9, 10] and offsets[emoji[-1] + 1] == text.index(" and") == 8  # not 9, 10 or 11


def test_a_stop_string_cuts_the_tokens_usage_and_logprobs_with_the_text(target):
    from headstart.serve.logprobs import keep
    from headstart.serve.text import TextStream

    reply = target.tokenizer(" 4, 5, 6, 7", add_special_tokens=False)["input_ids"]
    stream = TextStream(target.tokenizer, (" 6",))
    stream.feed(reply)
    assert stream.text == " 4, 5," and stream.stopped
    kept = stream.covering()
    assert target.tokenizer.decode(reply[:kept]) == " 4, 5,"  # the stop string's tokens are not counted
    cut = completion_logprobs(keep(score(target, reply, 0, 1), kept), Pieces(target.tokenizer))
    assert "".join(cut["tokens"]) == " 4, 5,"
    whole = TextStream(target.tokenizer, ())
    whole.feed(reply)
    assert whole.covering() == len(reply)
