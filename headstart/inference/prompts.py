"""Prompts in, one left-padded batch out; the context-limit check (error or truncation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from headstart.errors import HeadstartError


@dataclass
class Prompts:
    ids: torch.Tensor  # (B, T) left-padded, on the target's device
    valid: torch.Tensor  # (B, T) bool, False on padding
    host_ids: torch.Tensor  # the same two on the CPU: what the host needs (lookup, streamer, the
    host_valid: torch.Tensor  # output) never reads them back from the device
    unpadded: bool = False  # every row has the same length (known on the host: no device read)

    @property
    def batch(self) -> int:
        return int(self.ids.shape[0])

    def sequences(self, new: list[list[int]], pad_id: int) -> torch.Tensor:
        """(B, T + longest): the padded prompts followed by each row's new tokens, right padded
        with `pad_id` (the layout of transformers' `generate` on a left-padded batch)."""
        longest = max((len(row) for row in new), default=0)
        tail = torch.full((self.batch, longest), pad_id, dtype=torch.long)
        for b, row in enumerate(new):
            tail[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        return torch.cat([self.host_ids, tail], dim=1)


def _rows(input_ids: Any, attention_mask: torch.Tensor | None) -> list[list[int]]:
    if isinstance(input_ids, torch.Tensor):
        ids = input_ids if input_ids.dim() == 2 else input_ids[None]
        mask = attention_mask if attention_mask is not None else torch.ones_like(ids)
        mask = mask if mask.dim() == 2 else mask[None]
        return [row[m.bool()].tolist() for row, m in zip(ids.cpu(), mask.cpu(), strict=True)]
    if isinstance(input_ids, list | tuple) and input_ids and all(isinstance(i, int) for i in input_ids):
        return [list(input_ids)]
    if isinstance(input_ids, list | tuple) and all(isinstance(r, list | tuple) for r in input_ids):
        return [list(r) for r in input_ids]
    raise HeadstartError(
        "input_ids must be a list of ids, a list of lists or a (B, T) tensor", "tokenize the prompt first"
    )


def prepare_prompts(
    input_ids: Any,
    attention_mask: torch.Tensor | None,
    pad_id: int,
    max_new_tokens: int,
    context_limit: int | None,
    truncate: bool,
    device: Any,
) -> Prompts:
    """Left-pad the prompts; a prompt whose length + max_new_tokens exceeds the context limit is
    an error, or (truncate=True) keeps only its last `limit - max_new_tokens` tokens."""
    rows = _rows(input_ids, attention_mask)
    if not rows or any(len(r) == 0 for r in rows):
        raise HeadstartError("a prompt is empty", "pass at least one token per prompt")
    if context_limit:
        room = context_limit - max_new_tokens
        too_long = [len(r) for r in rows if len(r) > room]
        if too_long and (not truncate or room < 1):
            raise HeadstartError(
                f"prompt of {max(too_long)} tokens + max_new_tokens {max_new_tokens} exceeds the target's context of {context_limit}",
                "shorten the prompt, lower --max-new-tokens, or pass --truncate-prompt to keep the prompt's last tokens"
                if room >= 1 else f"lower --max-new-tokens below {context_limit}",
            )  # fmt: skip
        rows = [r[-room:] if len(r) > room else r for r in rows]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        valid[b, width - len(row) :] = True
    unpadded = all(len(r) == width for r in rows)
    return Prompts(ids.to(device), valid.to(device), ids, valid, unpadded)


class PrefillAborted(Exception):
    """A chunked prefill stopped because its `abort()` said so (nothing of it is kept)."""


def prefill_chunk(device: Any) -> int:
    """Prompt tokens per chunk of an abortable prefill: ~0.3 s of SmolLM2 on 2 CPU cores (2.4 ms
    a token), so a departed client or a server's shutdown waits at most that long; on a GPU a
    forward is launch-bound up to thousands of tokens, and chunks would only add launches."""
    return 128 if str(device).startswith("cpu") else 2048
