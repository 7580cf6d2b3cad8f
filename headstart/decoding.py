"""Decoding token ids for `generate` and `chat`, and the speculator `serve` runs: speculative
through the engine, or plain (transformers' `generate`, the reference; headstart's lean loop when
calibration set the heads aside), assembled once by `headstart.speculator.load_speculator`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headstart.inference.plain import SamplingConfig


@dataclass(frozen=True)
class DecodeOptions:
    """What the decoding commands' flags ask for (headstart/commands/generate.py builds it)."""

    heads: str | None = None
    """--heads: a heads directory or Hub id (None: the shipped heads, if any)."""
    tree: str | None = None
    plain: bool = False
    """--no-heads."""
    typical: bool = False
    compile: str = "off"
    """--compile: off, on or auto (CUDA only)."""
    calibrate: bool = True
    """--speculate auto: measure once whether the heads pay on this machine."""
    draft: str | None = None
    """--draft-model: a separate draft model or early-exit:K in place of heads."""
    draft_larger_ok: bool = False
    stops: tuple[str, ...] = ()
    truncate_prompt: bool = False


class Decoding:
    """Speculative or plain decoding of prompts' token ids with one sampling setting."""

    def __init__(self, target: Any, sampling: SamplingConfig, options: DecodeOptions) -> None:
        from headstart.inference.captured import wants_capture
        from headstart.speculator import load_speculator

        self.target, self.sampling, self.options = target, sampling, options
        capture = wants_capture(options.compile, target.device)
        self.speculator = load_speculator(target, options.heads, options.tree, plain=options.plain,
                                          greedy=sampling.greedy, typical=options.typical, compile=capture,
                                          calibrate=options.calibrate, draft_model=options.draft,
                                          draft_larger_ok=options.draft_larger_ok)  # fmt: skip
        self.heads = self.speculator.heads
        # plain decoding runs transformers' generate (the reference) unless compiled (the same
        # captured verify); when calibration set the heads aside, headstart's own lean plain loop
        # (inference.plain.cached_generate), the one it measured them against
        self.lean = bool(self.speculator.note) and not capture
        self.decoder = self.speculator.decoder if self.heads is not None or capture else None

    @property
    def mode(self) -> str:
        return self.speculator.mode

    def run(self, batch: list[list[int]], streamer: Any = None) -> list[tuple[list[int], dict[str, Any]]]:
        """(new token ids, stats) per prompt: each prompt's own figures, and under "batch" the
        figures of the whole batch (throughput and wall time are shared by its prompts)."""
        stops, truncate = self.options.stops, self.options.truncate_prompt
        if self.decoder is not None:
            out = self.decoder.generate(batch, sampling=self.sampling, stop_strings=stops, streamer=streamer,
                                        truncate_prompt=truncate)  # fmt: skip
            whole = out.stats.as_dict()
            return [(ids, out.stats.row_dict(i) | {"batch": whole}) for i, ids in enumerate(out.token_ids)]
        from headstart.inference.plain import cached_generate, plain_generate
        from headstart.inference.prompts import prepare_prompts

        limit = getattr(self.target.config, "max_position_embeddings", None)
        results = []
        for ids in batch:
            prompt = prepare_prompts([ids], None, 0, self.sampling.max_new_tokens, limit, truncate, "cpu")
            loop = cached_generate if self.lean else plain_generate
            result = loop(
                self.target, prompt.ids[0].tolist(), self.sampling, streamer=streamer, stop_strings=stops
            )
            stats = {"new_tokens": result.new_tokens, "tau": 1.0, "tokens_per_s": round(result.tokens_per_s, 2),
                     "target_forwards": result.target_forwards}  # fmt: skip
            # plain decoding runs each prompt alone: its batch is itself, with the same fields
            # as a speculative batch's (one token per forward after the prefill's)
            whole = stats | {"batch_size": 1, "wall_s": round(result.wall_s, 3),
                             "accept_length_histogram": {"1": max(result.target_forwards - 1, 0)}}  # fmt: skip
            results.append((result.token_ids, stats | {"batch": whole}))
        return results
