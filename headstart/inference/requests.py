"""What a stream of prompts hands an engine and gets back (distillation's interface to the decoding
engine, its OpenAI engine and its dataset engine): a `Request` per prompt, a `Reply` per answer,
and the engine's `EngineStats`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headstart.inference.plain import SamplingConfig


@dataclass
class Request:
    """One prompt to answer. `key` is the caller's (returned with the reply)."""

    key: Any
    prompt: list[int]
    sampling: SamplingConfig
    seed: int | None = None
    messages: list[dict[str, str]] | None = None
    """The chat the prompt renders, for engines that take messages, not ids (an API server)."""
    reference: str | None = None
    """The data's own reply to this turn, if it has one (`--engine dataset` answers with it)."""


@dataclass
class Reply:
    token_ids: list[int]  # the generated ids, end-of-turn id excluded
    finished: bool  # True when the target emitted an end-of-turn id (False: hit max_new_tokens)


@dataclass
class EngineStats:
    replies: int = 0
    new_tokens: int = 0  # generated tokens, end-of-turn ids included
    prompt_tokens: int = 0
    decode_steps: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    compactions: int = 0
    row_steps: int = 0  # live rows summed over decode steps (mean batch = row_steps / decode_steps)
    prefix_reused: int = 0  # prompt tokens copied from a shared prefix's cache instead of run per row

    def as_dict(self) -> dict[str, Any]:
        wall = self.prefill_s + self.decode_s
        return {
            "replies": self.replies,
            "new_tokens": self.new_tokens,
            "prompt_tokens": self.prompt_tokens,
            "prefix_reused": self.prefix_reused,
            "decode_steps": self.decode_steps,
            "mean_batch": round(self.row_steps / self.decode_steps, 2) if self.decode_steps else 0.0,
            "prefill_s": round(self.prefill_s, 2),
            "decode_s": round(self.decode_s, 2),
            "new_tokens_per_s": round(self.new_tokens / wall, 2) if wall > 0 else 0.0,
            "compactions": self.compactions,
        }
