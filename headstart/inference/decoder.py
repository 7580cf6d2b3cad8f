"""The self-speculative decoder's front: `SpeculativeDecoder.generate`, as transformers' generate
is called, exactly the target's output, faster.

    prefill -> [draft -> verify -> accept -> commit] * -> done

The steps are inference/steps.py's (`Steps`, which this class is), the loop that runs them over a
batch whose rows join and leave is inference/engine.py's (one engine for every caller: generate,
serve, distill, bench); `generate` admits every prompt at once and steps the engine until every row
has stopped.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from headstart.errors import HeadstartError
from headstart.inference.engine import Engine, Job
from headstart.inference.plain import SamplingConfig
from headstart.inference.prompts import prepare_prompts
from headstart.inference.results import GenerateOutput
from headstart.inference.steps import Steps
from headstart.inference.stops import StopRule
from headstart.targets.exactness import context_note


class SpeculativeDecoder(Steps):
    """Target + heads -> exactly the target's output, faster. `generate` feels like transformers'.

    tree: a TreeChoice (`choose_tree`: a `--tree` value parsed once), a `--tree` string, a
    TreeBuffers, a DynamicTree or None (the default static tree).
    typical: use Medusa's typical acceptance when sampling. LOSSY: the output is then NOT
    distributed as the target's; stats carry a `lossy` label.
    """

    read_ahead: bool | None = None
    """Plain decoding reads each step's tokens after queuing the next (inference/engine.py);
    None: on CUDA only. Set True or False on a decoder to force it."""

    @torch.no_grad()
    def generate(
        self,
        input_ids: Any,
        attention_mask: torch.Tensor | None = None,
        *,
        max_new_tokens: int = 128,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        sampling: SamplingConfig | None = None,
        eos_token_id: int | list[int] | None | str = "default",
        stop_strings: str | list[str] | tuple[str, ...] = (),
        streamer: Any = None,
        truncate_prompt: bool = False,
    ) -> GenerateOutput:
        """Decode `input_ids` (a list of ids, a list of lists, or a (B, T) tensor with an
        optional attention mask; left or right padding). Greedy unless `do_sample`."""
        if sampling is None:
            sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature if do_sample else 0.0,
                                      top_p=top_p, top_k=top_k, seed=seed)  # fmt: skip
        device = self.target.device
        pad_id = self.target.tokenizer.pad_token_id or 0
        limit = getattr(self.target.config, "max_position_embeddings", None)
        note = context_note(self.positions, limit)
        if note is not None:  # longrope/dynamic RoPE: exact only below its switch
            limit = self.positions.switch
        try:
            prompts = prepare_prompts(
                input_ids, attention_mask, pad_id, sampling.max_new_tokens, limit, truncate_prompt, device
            )
        except HeadstartError as err:
            if note is None:
                raise
            raise HeadstartError(f"{err.what}: {note}", "use `headstart generate --no-heads` (transformers' "
                                 "generate) for longer texts, or shorten the prompt or --max-new-tokens") from None  # fmt: skip
        eos = self.target.eos_token_ids if eos_token_id == "default" else _as_ids(eos_token_id)
        strings = (stop_strings,) if isinstance(stop_strings, str) else tuple(stop_strings)
        rule = StopRule(sampling.max_new_tokens, frozenset(eos), strings, self.target.tokenizer)
        if streamer is not None and prompts.batch > 1:
            raise HeadstartError(
                "streaming needs a single prompt", "drop the streamer or decode one prompt at a time"
            )
        if not sampling.greedy:
            self.tree.check_sampling()
        rows = [row[m].tolist() for row, m in zip(prompts.host_ids, prompts.host_valid, strict=True)]
        if streamer is not None:
            streamer.put(prompts.host_ids[0, prompts.host_valid[0]])
        jobs = [Job(key=i, prompt=row, rule=rule, stop_context=row) for i, row in enumerate(rows)]
        if streamer is not None:
            jobs[0].on_tokens = lambda tokens: streamer.put(torch.tensor(tokens))
        # the one continuous engine, every prompt admitted at once (a server admits as they come)
        engine = Engine(self, sampling, read_ahead=self.read_ahead)
        start = time.perf_counter()
        engine.add(jobs)
        while engine.live:
            engine.step()
        stats = engine.stats
        stats.batch_size, stats.target_forwards = prompts.batch, engine.target_forwards
        stats.prefills = engine.prefills
        stats.wall_s = time.perf_counter() - start
        if streamer is not None:
            streamer.end()
        emitted = [job.emitted for job in jobs]
        stats.per_row_tokens = [len(row) for row in emitted]
        stats.per_row_steps = [job.steps for job in jobs]
        stats.per_row_committed = [job.committed for job in jobs]
        stats.new_tokens = sum(stats.per_row_tokens)
        return GenerateOutput(emitted, prompts.sequences(emitted, pad_id), stats)


def _as_ids(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    return (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)
