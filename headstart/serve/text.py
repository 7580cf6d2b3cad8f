"""Token ids to the text a client receives: incremental, never half a character, stop strings
cut off (the OpenAI API returns the text before a stop string, without it)."""

from __future__ import annotations

from typing import Any


class TextStream:
    """Feed the reply's tokens as they come (`push`), read the text that is safe to send.

    A streamed step decodes only its new tokens, in a window that starts a few tokens back (a
    token may complete a multi-byte character the previous one started, and SentencePiece
    decodes a word's leading space from its context), as vLLM's incremental detokenizer does; the
    text is held back while it ends in a replacement character or could still be the start of a
    stop string; `finish` releases the rest. A stop string ends the text there.
    cost: a decode of a few tokens per streamed step, on the event loop (it decoded the whole
    reply so far each step: the loop's work grew with the square of the reply); a reply read
    whole uses `feed` and decodes once."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.tokens: list[int] = []
        self.sent = 0  # characters of the text already released
        self.stopped = False
        self.decoded = ""  # the streamed text so far (push)
        self.prefix_at = self.read_at = (
            0  # the decode window: tokens[prefix_at:] against tokens[prefix_at:read_at]
        )
        self.searched = 0  # characters of `decoded` already searched for a stop string

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

    def _increment(self) -> str:
        """The text the tokens since the last call add (vLLM's prefix/read offsets): '' while the
        window still ends inside a character."""
        decode = self.tokenizer.decode
        before = decode(self.tokens[self.prefix_at : self.read_at], skip_special_tokens=True)
        window = decode(self.tokens[self.prefix_at :], skip_special_tokens=True)
        if len(window) <= len(before) or window.endswith("\ufffd"):
            return ""
        self.prefix_at, self.read_at = max(self.read_at - 4, 0), len(self.tokens)
        return window[len(before) :]

    def push(self, tokens: list[int]) -> str:
        """New tokens in, the newly safe text out ('' while held back)."""
        self.tokens += tokens
        if self.stopped:  # the text ended at a stop string: what follows is not sent
            return ""
        self.decoded += self._increment()
        text = self.decoded
        longest = max((len(stop) for stop in self.stop), default=0)
        for stop in self.stop:  # only where the new text can hold one
            at = text.find(stop, max(self.searched - longest + 1, 0))
            if at >= 0:
                text, self.stopped = text[:at], True
        self.searched = len(self.decoded)
        if self.stopped:
            self.decoded = text
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
