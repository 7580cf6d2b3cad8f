"""TextStream: what a streamed reply sends equals the reply's text, whatever the steps' sizes,
split characters and stop strings; each step decodes a few tokens, not the reply so far."""

from __future__ import annotations

import random

import pytest

from headstart.serve.text import TextStream


@pytest.fixture(scope="module")
def tokenizer(tiny_llama):
    from headstart.targets import load_target

    return load_target(str(tiny_llama)).tokenizer


TEXTS = ["Emoji: 😀 and café, 中文 text.", "plain words " * 20, "1, 2, 3, 4, 5, 6, 7, 8", "naïve — ünïcödé ✓"]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("stop", [(), (", 6",), ("and", "text"), ("zzz",)])
def test_streamed_chunks_join_to_the_whole_text(tokenizer, text, stop):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    rng = random.Random(hash((text, stop)) & 0xFFFF)
    for _ in range(5):
        stream, sent, at = TextStream(tokenizer, stop), [], 0
        while at < len(ids):
            step = rng.randint(1, 4)
            sent.append(stream.push(ids[at : at + step]))
            at += step
        sent.append(stream.finish())
        whole = TextStream(tokenizer, stop)
        whole.feed(ids)
        assert "".join(sent) == whole.text
        assert not any("\ufffd" in chunk for chunk in sent)  # never half a character
        assert stream.stopped == whole.stopped == any(s in text for s in stop)


def test_a_step_decodes_a_window_not_the_reply(tokenizer):
    calls = []

    class Counting:
        def decode(self, ids, **kwargs):
            calls.append(len(ids))
            return tokenizer.decode(ids, **kwargs)

    ids = tokenizer("word " * 200, add_special_tokens=False)["input_ids"]
    stream = TextStream(Counting())
    for token in ids:
        stream.push([token])
    assert max(calls) <= 8  # it decoded all tokens so far, every step
