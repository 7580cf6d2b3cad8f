"""Batched generation with the target: left padding, the KV cache of `generate`, every EOS id."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headstart.targets import Target


@dataclass(frozen=True)
class Sampling:
    """Decoding settings of one `generate_batch` call (recorded with the data)."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
        }


@dataclass
class Reply:
    token_ids: list[int]  # the generated ids, end-of-turn id excluded
    finished: bool  # True when the target emitted an end-of-turn id (False: hit max_new_tokens)


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (B, T_max), padded on the left so every row ends together."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def generate_batch(
    target: Target, prompts: Sequence[Sequence[int]], sampling: Sampling, seed: int | None = None
) -> list[Reply]:
    """One reply per prompt; generation stops per row at any of `target.eos_token_ids`.

    With sampling, `seed` makes the batch reproducible (a resumed run regenerates the same data).
    """
    pad_id = target.tokenizer.pad_token_id
    pad_id = pad_id if pad_id is not None else (target.eos_token_ids[0] if target.eos_token_ids else 0)
    ids, mask = left_pad(prompts, pad_id, target.device)
    kwargs: dict[str, Any] = {"do_sample": sampling.temperature > 0}
    if sampling.temperature > 0:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or None)
        if seed is not None:
            torch.manual_seed(seed)
    else:
        # Silence the generation config's own sampling defaults (SmolLM2 ships temperature/top_p).
        kwargs.update(temperature=None, top_p=None, top_k=None)
    out = target.model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=sampling.max_new_tokens,
        eos_token_id=list(target.eos_token_ids) or None,
        pad_token_id=pad_id,
        **kwargs,
    )
    new = out[:, ids.shape[1] :].tolist()  # cost: one device->host copy per batch
    stops = set(target.eos_token_ids)
    replies = []
    for row in new:
        cut = next((j for j, tok in enumerate(row) if tok in stops), None)
        replies.append(Reply(token_ids=row if cut is None else row[:cut], finished=cut is not None))
    return replies
