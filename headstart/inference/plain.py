"""Plain (non-speculative) generation with the target: the reference every decoder must match."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from headstart.targets import Target

MIN_TEMPERATURE = 1e-5
"""The least temperature that samples (vLLM's threshold too): below it the server decodes
greedily, and `generate` refuses it."""


@dataclass(frozen=True)
class SamplingConfig:
    """How tokens are chosen; shared by plain and speculative decoding."""

    max_new_tokens: int = 128
    """Generate at most this many new tokens (exactly this many unless a stop hits first)."""
    temperature: float = 0.0
    """0 means greedy (argmax); > 0 samples from softmax(logits / temperature)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with cumulative probability >= top_p."""
    top_k: int = 0
    """Keep only the top_k most likely tokens (0 = no limit)."""
    seed: int | None = None
    """Seed for sampling (None = nondeterministic)."""

    def __post_init__(self) -> None:
        from headstart.errors import HeadstartError

        if self.max_new_tokens < 1:
            raise HeadstartError(
                f"--max-new-tokens must be >= 1, got {self.max_new_tokens}", "use --max-new-tokens 128"
            )
        if 0 < self.temperature < MIN_TEMPERATURE:  # logits / temperature overflow to inf, then nan
            raise HeadstartError(
                f"--temperature {self.temperature} is below {MIN_TEMPERATURE}: it is greedy decoding in all "
                "but name, and dividing the logits by it overflows",
                "use --temperature 0 (greedy)",
            )
        if not 0 <= self.temperature < float("inf"):  # also refuses nan (every comparison is False)
            raise HeadstartError(
                f"--temperature must be a finite number >= 0, got {self.temperature}",
                "use 0 for greedy, e.g. 0.7 to sample",
            )
        if not 0 < self.top_p <= 1:
            raise HeadstartError(f"--top-p must be in (0, 1], got {self.top_p}", "use --top-p 1.0 to disable")
        if self.top_k < 0:
            raise HeadstartError(f"--top-k must be >= 0, got {self.top_k}", "use --top-k 0 to disable")
        check_seed(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


SEED_LIMIT = 2**63
"""Seeds torch takes: 0 .. 2**63 - 1."""


def check_seed(seed: int | None, flag: str = "--seed") -> None:
    from headstart.errors import HeadstartError

    if seed is not None and not 0 <= seed < SEED_LIMIT:
        raise HeadstartError(f"{flag} must be in 0..2**63-1, got {seed}", f"use e.g. {flag} 0")


@dataclass
class GenerationResult:
    token_ids: list[int]
    new_tokens: int
    target_forwards: int
    wall_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0


def plain_generate(
    target: Target,
    input_ids: list[int],
    sampling: SamplingConfig,
    streamer: Any = None,
    stop_strings: tuple[str, ...] = (),
) -> GenerationResult:
    """`target.model.generate` with our sampling settings; stops at every declared EOS id and at
    `stop_strings`."""
    if sampling.seed is not None:
        torch.manual_seed(sampling.seed)
    ids = torch.tensor([input_ids], device=target.device)
    kwargs: dict[str, Any] = {"do_sample": not sampling.greedy}
    if stop_strings:
        kwargs.update(stop_strings=list(stop_strings), tokenizer=target.tokenizer)
    if not sampling.greedy:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or None)
    start = time.perf_counter()
    out = target.model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=sampling.max_new_tokens,
        eos_token_id=list(target.eos_token_ids) or None,
        pad_token_id=target.tokenizer.pad_token_id,
        streamer=streamer,
        **kwargs,
    )
    wall = time.perf_counter() - start
    new = out[0, ids.shape[1] :].tolist()
    return GenerationResult(token_ids=new, new_tokens=len(new), target_forwards=len(new), wall_s=wall)


@torch.no_grad()
def cached_generate(target: Target, input_ids: list[int], sampling: SamplingConfig, streamer: Any = None,
                    stop_strings: tuple[str, ...] = ()) -> GenerationResult:  # fmt: skip
    """Plain decoding (one token per target forward) through headstart's own forward: the growing
    KV cache and the small-row CPU kernels the speculative decoder's verify uses, no drafts, no
    tree bookkeeping (the leanest loop: what calibration measures heads against, and what
    `generate` runs when they do not pay). `bench --baselines plain` runs it so that a report
    separates what those kernels give from what speculation gives. Same tokens as `plain_generate`
    (greedy; sampling draws from the same p); `streamer` gets each token, `stop_strings` end it."""
    from headstart.inference.sampling import probabilities, sample
    from headstart.inference.stops import StopRule
    from headstart.targets import forward, new_cache
    from headstart.targets.packing import PackedLinears, packed

    model = target.model
    generator = None
    if sampling.seed is not None:
        generator = torch.Generator(device=target.device).manual_seed(sampling.seed)
    rule = StopRule(sampling.max_new_tokens, frozenset(target.eos_token_ids), tuple(stop_strings),
                    target.tokenizer if stop_strings else None)  # fmt: skip
    packer = PackedLinears.for_model(model)
    ids = torch.tensor([input_ids], device=target.device)  # (1, T)
    start = time.perf_counter()
    cache = new_cache(model)
    logits = forward(model, ids, past_key_values=cache, logits_to_keep=1).logits[:, -1]  # (1, V)
    emitted: list[int] = []
    forwards = 1
    while True:
        token = logits.argmax(-1) if sampling.greedy else sample(probabilities(logits, sampling), generator)
        before = len(emitted)
        done = rule.take(emitted, token.tolist(), input_ids)  # one host sync per token, as generate's
        if streamer is not None and len(emitted) > before:
            streamer.put(torch.tensor(emitted[before:]))
        if done:
            break
        position = torch.tensor([[len(input_ids) + len(emitted) - 1]], device=target.device)
        with packed([packer], 1):
            logits = forward(model, token[:, None], position_ids=position, past_key_values=cache).logits[
                :, -1
            ]
        forwards += 1
    wall = time.perf_counter() - start
    if streamer is not None:
        streamer.end()
    return GenerationResult(token_ids=emitted, new_tokens=len(emitted), target_forwards=forwards, wall_s=wall)
