"""What of a target's own `generate(do_sample=False)` the decoder must reproduce beyond its layers
(layer_kinds.py): the logits processors its generation_config asks for, and the positions its
embeddings can take.

* Logits processors (repetition_penalty, no_repeat_ngram_size, suppress_tokens, ...) change the
  greedy token. headstart's decoder applies none of them, so a target that declares one is refused
  in one line rather than decoded differently from `generate` (`headstart generate --no-heads`
  goes through transformers' generate, which applies them).
* RoPE whose frequencies follow the forward's longest position (transformers'
  `dynamic_rope_update`): `longrope` (Phi-3/3.5 long-context) switches a whole forward to its long
  factors once any position reaches `original_max_position_embeddings`, and Phi-3's generate then
  drops its cache and recomputes every earlier position with them; `dynamic` (NTK) rescales with
  every new longest position. headstart's decoder keeps its cache, so for these targets it decodes
  exactly only below that position: `switch`, which caps the context decode and serve accept, and
  no verify may place a node at or past it (near the end such steps are plain, one token).
* A learned position table (OPT, GPT-2) has no row past `max_position_embeddings`: a tree drafted
  near the end of the context would index past it. Such steps are taken plainly too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from headstart.errors import HeadstartError

PROCESSORS = {  # generation_config field -> its neutral value (what changes the greedy token)
    "guidance_scale": 1.0,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "min_length": 0,
    "min_new_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None,
}


def unapplied_processors(model: nn.Module) -> list[str]:
    """`field=value` for each greedy logits processor the model's generation_config turns on."""
    config = getattr(model, "generation_config", None)
    found = []
    for name, neutral in PROCESSORS.items():
        value = getattr(config, name, None)
        # as transformers builds them: a count only when > 0, a collection only when non-empty
        if value is None or value == neutral or (not isinstance(value, int | float) and not value):
            continue
        if name in ("min_length", "min_new_tokens", "no_repeat_ngram_size") and value <= 0:
            continue
        found.append(f"{name}={value}")
    return found


def check_no_processors(model: nn.Module) -> None:
    found = unapplied_processors(model)
    if found:
        raise HeadstartError(
            f"this target's generation_config asks generate for {', '.join(found)}, which headstart's "
            "decoder does not apply: its output would differ from generate's",
            "use `headstart generate --no-heads` (transformers' generate applies it), or remove it from "
            "the model's generation_config.json",
        )


def _rope(config: Any) -> dict[str, Any]:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return params if isinstance(params, dict) else {}


@dataclass(frozen=True)
class Positions:
    table: int | None = None  # a learned position table's size: nodes must stay below it
    switch: int | None = None  # longrope's original_max_position_embeddings: no verify may straddle it

    @property
    def limited(self) -> bool:
        return self.table is not None or self.switch is not None


def positions(model: nn.Module) -> Positions:
    """The position limits a decode must respect (read once per model: a server builds a decoder
    per batch)."""
    found = model.__dict__.get("_headstart_positions")
    if found is None:
        found = _read_positions(model)
        model.__dict__["_headstart_positions"] = found
    return found


def _read_positions(model: nn.Module) -> Positions:
    config = model.config
    rope = _rope(config)
    kind = rope.get("rope_type") or rope.get("type")
    switch = None
    if kind in ("longrope", "dynamic"):
        switch = int(
            rope.get("original_max_position_embeddings")
            or getattr(config, "original_max_position_embeddings", 0)
            or getattr(config, "max_position_embeddings", 0)
        )
    table = None
    learned = any(
        isinstance(module, nn.Embedding)
        and name.split(".")[-1] in ("embed_positions", "wpe", "position_embeddings")
        for name, module in model.named_modules()
    )
    if learned:
        table = (
            int(getattr(config, "max_position_embeddings", 0) or getattr(config, "n_positions", 0)) or None
        )
    return Positions(table=table, switch=switch)


def must_step_plainly(limits: Positions, lengths: list[int], span: int) -> bool:
    """Whether a verify of up to `span` nodes past rows of these lengths (prompt + emitted) could
    reach the position table's end or longrope's switch. (Conservative by one position: the root
    sits at length - 1 or length.)"""
    ends = [end for end in (limits.table, limits.switch) if end is not None]
    return bool(lengths and ends) and max(lengths) + span >= min(ends)


def context_note(limits: Positions, context: int | None) -> str | None:
    """Why the context is `limits.switch` rather than the config's, when it is."""
    if limits.switch is None or (context is not None and context <= limits.switch):
        return None
    return (
        f"this target's RoPE changes for the whole sequence past position {limits.switch} (generate "
        "recomputes its cache there), which headstart's decoder cannot follow: it decodes exactly within "
        f"{limits.switch} tokens, prompt included"
    )
