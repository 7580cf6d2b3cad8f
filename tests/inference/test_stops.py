"""StopRule: where a row ends, one token at a time."""

from __future__ import annotations

import pytest
from tiny import make_tokenizer

from headstart.inference.stops import StopRule


@pytest.mark.parametrize("stop", ["END", "한국어", "🎉🎉🎉", "日本語のテキスト"])
def test_a_stop_string_of_multi_byte_characters_stops_the_row(stop):
    """One token per byte (the tiny byte-level tokenizer): "한국어" is 3 characters and 9 tokens.
    The decoded window was sized in characters, so such a stop string never fell inside it and
    the row decoded on to max_new_tokens (the text was cut, the tokens were not)."""
    tok = make_tokenizer()
    ids = tok.encode("some text first, then " + stop + " and more after", add_special_tokens=False)
    rule = StopRule(1000, stop_strings=(stop,), tokenizer=tok)
    emitted: list[int] = []
    for token in ids:
        if rule.take(emitted, [token]):
            break
    assert tok.decode(emitted).endswith(stop), tok.decode(emitted)


def test_max_new_tokens_and_eos_stop_exactly():
    rule = StopRule(3, eos_token_ids=frozenset({9}))
    emitted: list[int] = []
    assert not rule.take(emitted, [1, 2]) and rule.take(emitted, [3, 4, 5]) and emitted == [1, 2, 3]
    emitted = []
    assert StopRule(10, eos_token_ids=frozenset({9})).take(emitted, [1, 9, 2]) and emitted == [1, 9]
