"""Decoding methods measured by the bench: vanilla `generate`, prompt-lookup decoding, headstart's
plain decoding (its own forward and kernels, no drafts), headstart heads.

Every method turns prompt ids into new token ids and reports how many target forwards it ran
(counted by a forward hook on the target model, so the count is the same for every method).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from headstart.inference.plain import SamplingConfig
from headstart.targets import Target


@dataclass
class Run:
    """One method on one prompt."""

    token_ids: list[int]
    target_forwards: int
    wall_s: float
    accept_lengths: list[int] = field(default_factory=list)
    """Tokens committed per target forward (speculative methods only; bonus token included)."""
    by_position: dict[str, list[int]] = field(default_factory=dict)
    """Per context bucket: [rounds, tokens committed, rounds that accepted a draft] (DecodeStats)."""


class ForwardCounter:
    """Counts calls of the target model's forward (one per decoding step, prefill included)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        self._handle = model.register_forward_pre_hook(self._count)

    def _count(self, _module: torch.nn.Module, _args: Any) -> None:
        self.calls += 1

    def close(self) -> None:
        self._handle.remove()


Method = Callable[[list[int]], Run]


def _generate_kwargs(target: Target, sampling: SamplingConfig) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "max_new_tokens": sampling.max_new_tokens,
        "do_sample": not sampling.greedy,
        "eos_token_id": list(target.eos_token_ids) or None,
        "pad_token_id": target.tokenizer.pad_token_id,
    }
    if not sampling.greedy:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or None)
    return kwargs


def hf_method(target: Target, sampling: SamplingConfig, **extra: Any) -> Method:
    """transformers `generate` (vanilla, or PLD with `prompt_lookup_num_tokens`)."""

    def run(prompt_ids: list[int]) -> Run:
        ids = torch.tensor([prompt_ids], device=target.device)
        counter = ForwardCounter(target.model)
        try:
            start = time.perf_counter()
            out = target.model.generate(
                ids, attention_mask=torch.ones_like(ids), **_generate_kwargs(target, sampling), **extra
            )
            wall = time.perf_counter() - start
        finally:
            counter.close()
        return Run(token_ids=out[0, ids.shape[1] :].tolist(), target_forwards=counter.calls, wall_s=wall)

    return run


def vanilla(target: Target, sampling: SamplingConfig) -> Method:
    return hf_method(target, sampling)


def pld(target: Target, sampling: SamplingConfig, lookup_tokens: int = 10) -> Method:
    """Prompt-lookup decoding (transformers' n-gram drafting from the prompt), greedy only."""
    return hf_method(target, sampling, prompt_lookup_num_tokens=lookup_tokens)


def plain(target: Target, sampling: SamplingConfig) -> Method:
    """headstart's own forward without drafts (inference.plain.cached_generate): one token per
    target forward on the same kernels and KV cache as the speculative decoder's verify."""
    from headstart.inference.plain import cached_generate

    def run(prompt_ids: list[int]) -> Run:
        out = cached_generate(target, prompt_ids, sampling)
        return Run(token_ids=out.token_ids, target_forwards=out.target_forwards, wall_s=out.wall_s)

    return run


def speculative(decoder: Any, sampling: SamplingConfig) -> Method:
    """headstart self-speculative decoding with `decoder` (headstart.speculator.load_speculator's)."""

    def run(prompt_ids: list[int]) -> Run:
        out = decoder.generate([prompt_ids], sampling=sampling)
        lengths = [n for n, count in sorted(out.stats.accept_lengths.items()) for _ in range(count)]
        return Run(
            token_ids=out.token_ids[0],
            target_forwards=out.stats.target_forwards,
            wall_s=out.stats.wall_s,
            accept_lengths=lengths,
            by_position={name: list(counts) for name, counts in out.stats.by_position.items()},
        )

    return run
