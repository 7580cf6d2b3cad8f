"""Log-probabilities of served tokens: what `logprobs` (completions: top-N; chat: `logprobs` +
`top_logprobs`) and `echo` return.

What they are: the log-softmax of the TARGET's raw logits at each position, before temperature,
top-p, top-k or any other warping: vLLM's default (`--logprobs-mode raw_logprobs`), and what a
loglikelihood evaluation (lm-evaluation-harness) needs: the model's own distribution, whatever
the request samples with. Sampling parameters change which tokens are drawn, never the numbers
reported for them.

Where they come from: ONE forward of the target over the finished sequence (prompt + reply), run
alone, after the reply is decoded, and not the logits the decode steps saw. Those depend on how
the reply was decoded: a tree verify's logits and a plain step's differ in the last bits (other
matmul shapes; the small-row kernel; the rows batched beside it), so logprobs read from them
would differ with heads on and off, and with the load. A forward over the same tokens computed
the same way gives the same bits whatever decoded them: greedy replies are the same tokens with
heads or without, so their logprobs are identical to the last digit (tests/serve). The argmax of
this forward is the decoded token except where two logits tie within float rounding.
cost: one extra target forward over prompt + reply per request that asks (a prefill's worth,
run in the decode loop's thread between steps, CHUNK positions at a time over a KV cache);
lm_head rows only for the positions reported, CHUNK x vocabulary floats at a time (50 MB for
SmolLM2, where the whole sequence's logits were 0.4 GB for 2,048 positions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

CHUNK = 256  # positions per log-softmax: bounds the float copies of (positions, vocab)


@dataclass(frozen=True)
class Scored:
    """The log-probabilities of tokens[start:] of a sequence; position 0 has none (no context)."""

    tokens: list[int]
    logprobs: list[float | None]
    top: list[list[tuple[int, float]]]  # per token: the N most likely (id, logprob); [] at position 0


@torch.no_grad()
def score(target: Any, ids: list[int], start: int, top: int) -> Scored:
    """Log-probabilities of ids[start:] under the target, with the `top` most likely tokens at
    each position. The sequence runs through the target CHUNK positions at a time over a KV
    cache (each chunk a causal chain after the cached prefix, the decoder's verify mask), so the
    logits held at once are (CHUNK, vocabulary), not (positions, vocabulary)."""
    from headstart.targets import forward, new_cache, tree_attention_mask

    first = max(start, 1)
    tokens = ids[start:]
    logprobs: list[float | None] = [None] * (first - start)
    tops: list[list[tuple[int, float]]] = [[] for _ in range(first - start)]
    if first >= len(ids):
        return Scored(tokens, logprobs, tops)
    device, model = target.device, target.model
    batch = torch.tensor([ids], device=device)  # (1, L)
    cache = new_cache(model, reserve=len(ids))
    # positions first-1 .. L-2 predict the tokens scored; the last position predicts past the end
    for at in range(0, len(ids) - 1, CHUNK):
        end = min(at + CHUNK, len(ids) - 1)
        wanted = end - max(at, first - 1)  # the chunk's last rows whose logits are read
        chain = torch.ones(end - at, end - at, dtype=torch.bool, device=device).tril()
        mask = tree_attention_mask(torch.ones(1, at, dtype=torch.bool, device=device), chain, model.dtype)
        logits = forward(model, batch[:, at:end], attention_mask=mask, past_key_values=cache,
                         position_ids=torch.arange(at, end, device=device)[None],
                         logits_to_keep=max(wanted, 1)).logits[0]  # fmt: skip
        if wanted <= 0:
            continue
        rows = torch.log_softmax(logits[-wanted:].float(), dim=-1)  # (c, V)
        chosen = rows.gather(1, batch[0, end - wanted + 1 : end + 1, None])[:, 0]
        logprobs += chosen.tolist()  # host sync, once per chunk
        if top:
            values, order = rows.topk(min(top, rows.shape[-1]), dim=-1)
            tops += [
                list(zip(i, v, strict=True)) for i, v in zip(order.tolist(), values.tolist(), strict=True)
            ]
        else:
            tops += [[] for _ in range(rows.shape[0])]
    return Scored(tokens, logprobs, tops)


def _byte_level_map() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte (the inverse of its bytes_to_unicode: printable
    bytes stand for themselves, the others are shifted past 255)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, shift = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + shift)] = byte
            shift += 1
    return chars


class Pieces:
    """Token ids to their own bytes and the text each stands for (memoised: top lists repeat
    tokens). A token's bytes are its exact share of the reply's UTF-8 bytes, also when it holds part
    of a character (decoding it alone would give U+FFFD): from the byte-level alphabet (GPT-2,
    Llama 3, Qwen, SmolLM), from `<0xNN>` byte-fallback pieces and `▁` (SentencePiece), else from
    its decoded text. Such a token's text is written `bytes:\\xNN...`, as OpenAI writes it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.known: dict[int, tuple[bytes, str]] = {}
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = type(getattr(backend, "decoder", None)).__name__
        self.byte_level = _byte_level_map() if decoder == "ByteLevel" else None
        self.special = set(getattr(tokenizer, "all_special_ids", []) or [])

    def _bytes(self, token: int) -> bytes:
        if token not in self.special:
            piece = self.tokenizer.convert_ids_to_tokens(token)
            if isinstance(piece, str):
                if self.byte_level is not None and all(c in self.byte_level for c in piece):
                    return bytes(self.byte_level[c] for c in piece)
                if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                    try:
                        return bytes([int(piece[3:5], 16)])
                    except ValueError:
                        pass
                if self.byte_level is None and "\u2581" in piece:  # SentencePiece's word start
                    return piece.replace("\u2581", " ").encode("utf-8")
        return self.tokenizer.decode([token], skip_special_tokens=False).encode("utf-8")

    def entry(self, token: int) -> tuple[bytes, str]:
        if token not in self.known:
            raw = self._bytes(token)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:  # part of a character
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            self.known[token] = (raw, text)
        return self.known[token]

    def __call__(self, token: int) -> str:
        return self.entry(token)[1]

    def raw(self, token: int) -> bytes:
        return self.entry(token)[0]


def text_offsets(tokens: list[int], pieces: Pieces) -> list[int]:
    """Each token's character offset in the text the tokens decode to: the characters completed
    before its first byte (a token that finishes a character split across tokens starts at that
    character). cost: one incremental UTF-8 decode of the tokens' bytes."""
    import codecs

    decoder, offsets, at = codecs.getincrementaldecoder("utf-8")(errors="replace"), [], 0
    for token in tokens:
        offsets.append(at)
        at += len(decoder.decode(pieces.raw(token)))
    return offsets


def keep(scored: Scored, count: int) -> Scored:
    """The first `count` scored tokens (a reply cut by a stop string: the tokens its text covers)."""
    return Scored(scored.tokens[:count], scored.logprobs[:count], scored.top[:count])


def completion_logprobs(scored: Scored, pieces: Pieces) -> dict[str, Any]:
    """The completions API's `logprobs`: per token its text, logprob, a dict of the top ones (the
    chosen token always in it, as OpenAI documents) and its character offset in the choice's text."""
    texts = [pieces(t) for t in scored.tokens]
    offsets = text_offsets(scored.tokens, pieces)
    tops: list[dict[str, float] | None] = []
    for token, logprob, best in zip(scored.tokens, scored.logprobs, scored.top, strict=True):
        if logprob is None:
            tops.append(None)
            continue
        entry: dict[str, float] = {}
        for i, value in [*best, (token, logprob)]:  # tokens of one text (bytes of a character): the best
            entry.setdefault(pieces(i), value)
        tops.append(entry)
    return {
        "tokens": texts,
        "token_logprobs": list(scored.logprobs),
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def chat_logprobs(scored: Scored, pieces: Pieces) -> dict[str, Any]:
    """The chat API's `logprobs`: per token its text, UTF-8 bytes, logprob and top alternatives."""

    def entry(token: int, logprob: float) -> dict[str, Any]:
        return {"token": pieces(token), "logprob": logprob, "bytes": list(pieces.raw(token))}

    content = [
        {**entry(token, logprob), "top_logprobs": [entry(i, value) for i, value in best]}
        for token, logprob, best in zip(scored.tokens, scored.logprobs, scored.top, strict=True)
        if logprob is not None
    ]
    return {"content": content, "refusal": None}
