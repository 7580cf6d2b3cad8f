"""When a row stops: any end-of-sequence id, a stop string, or exactly `max_new_tokens` tokens.

Several tokens are committed per step, so each step's tokens are taken one by one up to the
first stop: never one token more than `max_new_tokens`, nothing after an EOS (the EOS itself is
kept, as transformers' `generate` keeps it), nothing after the token that completes a stop string.
"""

from __future__ import annotations

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

    def _completes_stop_string(self, emitted: Sequence[int]) -> bool:
        tail = self.tokenizer.decode(list(emitted[-self._tail_tokens :]), skip_special_tokens=False)
        return any(s in tail for s in self.stop_strings)

    def take(self, emitted: list[int], new: Sequence[int]) -> bool:
        """Append `new` to `emitted` (in place) up to the first stop; True when the row is done."""
        for token in new:
            emitted.append(int(token))
            if len(emitted) >= self.max_new_tokens or int(token) in self.eos_token_ids:
                return True
            if self.stop_strings and self._completes_stop_string(emitted):
                return True
        return False
