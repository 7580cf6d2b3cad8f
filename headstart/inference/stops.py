"""When a row stops: any end-of-sequence id, a stop string, or exactly `max_new_tokens` tokens.

Several tokens are committed per step, so each step's tokens are taken one by one up to the
first stop: never one token more than `max_new_tokens`, nothing after an EOS (the EOS itself is
kept, as transformers' `generate` keeps it), nothing after the token that completes a stop string.

A stop string is matched as transformers' `StopStringCriteria` matches it: in the text of the
whole sequence, prompt included, when it overlaps the token just taken (the prompt's "is" and a
reply's " Paris" complete "is Paris"; a stop string wholly inside the prompt stops nothing).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StopRule:
    max_new_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    tokenizer: Any = None
    _tail_tokens: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.stop_strings and self.tokenizer is None:
            from headstart.errors import HeadstartError

            raise HeadstartError(
                "stop strings need a tokenizer to decode text", "pass the target's tokenizer"
            )
        # A token decodes to at least one byte, so a stop string of b UTF-8 bytes spans at most b
        # tokens (+ a few for a character split at the window's start). Counting characters
        # missed multi-byte ones: "한국어" is 3 characters and 8 of SmolLM2's tokens.
        self._tail_tokens = max((len(s.encode("utf-8")) for s in self.stop_strings), default=0) + 4

    def _completes_stop_string(self, emitted: Sequence[int], context: Sequence[int]) -> bool:
        n = self._tail_tokens
        ids = list(emitted[-n:])
        if len(ids) < n and context:  # the prompt's end belongs to the text too
            ids = list(context[-(n - len(ids)) :]) + ids
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        before = self.tokenizer.decode(ids[:-1], skip_special_tokens=False)
        start = len(os.path.commonprefix([before, text]))  # where the newest token's text begins
        # the last occurrence ends latest: it overlaps the newest token, or none does
        return any((at := text.rfind(s)) >= 0 and at + len(s) > start for s in self.stop_strings)

    def take(self, emitted: list[int], new: Sequence[int], context: Sequence[int] = ()) -> bool:
        """Append `new` to `emitted` (in place) up to the first stop; True when the row is done.
        `context`: the row's prompt, whose end a stop string may start in."""
        for token in new:
            emitted.append(int(token))
            if len(emitted) >= self.max_new_tokens or int(token) in self.eos_token_ids:
                return True
            if self.stop_strings and self._completes_stop_string(emitted, context):
                return True
        return False
