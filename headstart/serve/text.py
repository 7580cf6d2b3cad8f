"""Token ids to the text a client receives: incremental, never half a character, stop strings
cut off (the OpenAI API returns the text before a stop string, without it)."""

from __future__ import annotations

from typing import Any


class TextStream:
    """Feed the reply's tokens as they come (`push`), read the text that is safe to send.

    Text is decoded from all tokens so far (a token may complete a multi-byte character the
    previous one started) and held back while it ends in a replacement character or could still
    be the start of a stop string; `finish` releases the rest. A stop string ends the text there.
    cost: one decode of the reply so far per streamed step, on the event loop (steps commit
    several tokens; a reply read whole uses `feed` and decodes once)."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.tokens: list[int] = []
        self.sent = 0  # characters of the text already released
        self.stopped = False

    def _text(self) -> str:
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        for stop in self.stop:
            at = text.find(stop)
            if at >= 0:
                text, self.stopped = text[:at], True
        return text

    def feed(self, tokens: list[int]) -> None:
        """New tokens in, nothing decoded: a reply read whole decodes once (`text`), not once a
        step (the event loop's cost would grow with the square of the reply's length)."""
        self.tokens += tokens

    def push(self, tokens: list[int]) -> str:
        """New tokens in, the newly safe text out ('' while held back)."""
        self.tokens += tokens
        text = self._text()
        if self.stopped:
            return self._release(text)
        keep = len(text)
        if text.endswith("\ufffd"):  # a character whose bytes are still coming
            keep = len(text.rstrip("\ufffd"))
        for stop in self.stop:  # the tail that could still grow into a stop string
            for n in range(min(len(stop) - 1, keep), 0, -1):
                if text[:keep].endswith(stop[:n]):
                    keep -= n
                    break
        return self._release(text[:keep])

    def finish(self) -> str:
        """The rest of the text (the reply has ended)."""
        return self._release(self._text())

    def _release(self, text: str) -> str:
        out = text[self.sent :]
        self.sent = max(self.sent, len(text))
        return out

    @property
    def text(self) -> str:
        return self._text()

    def covering(self) -> int:
        """How many tokens the text stands for: all of them, unless a stop string cut it; then the
        fewest whose text reaches the cut (the token the stop string starts in counts, the tokens
        wholly inside it do not), so usage and logprobs describe the text returned.
        cost: a binary search of decodes, only for a reply a stop string cut."""
        text = self._text()
        if not self.stopped:
            return len(self.tokens)
        low, high = 0, len(self.tokens)
        while low < high:
            mid = (low + high) // 2
            reached = self.tokenizer.decode(self.tokens[:mid], skip_special_tokens=True).rstrip("\ufffd")
            if len(reached) >= len(text):
                high = mid
            else:
                low = mid + 1
        return low
