"""Draft models: the classic drafter beside the heads. A separate causal LM that shares the
target's tokenizer (a smaller sibling: Llama-3.2-1B for Llama-3.1-8B), or the target's own first
k layers with its final norm and lm_head (early exit, self-speculation without training). Either
drafts token trees for the one tree verifier, so the output is exactly the target's.

    from headstart.drafts import load_draft_model
    draft = load_draft_model("HuggingFaceTB/SmolLM2-135M-Instruct", target)   # or "early-exit:8"
    decoder = SpeculativeDecoder(target, draft, tree="chain:4")

Its drafter (headstart/inference/drafters/draft_model.py) is the `draft` head kind's (headstart/catalogue.py:
a trained draft, heads/draft.py, drafts the same way): this module never imports the decoder's layers.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any

from torch import nn

from headstart.errors import HeadstartError
from headstart.heads.draft import DraftLM, check_draft_pair

log = logging.getLogger(__name__)

EARLY_EXIT = "early-exit:"
DEFAULT_TREE = "chain:4"
"""The tree a draft model drafts when no --tree is given: one forward of the draft per level, so a
chain (EAGLE's and vLLM's default draft-model shape); `headstart bench --tree` compares others."""


@dataclass
class DraftModel:
    """A causal LM drafting for a target (the decoder takes it where it takes heads)."""

    model: nn.Module
    spec: str
    """What was asked for: a Hub id, a directory, a .gguf, or early-exit:K."""
    early_exit: int | None = None
    """The target's first k layers (early exit); None for a separate model."""
    pack_model: nn.Module | None = None
    """The model whose packed weights its linears use (the target's, for early exit)."""
    kind = DraftLM.kind  # its drafter is that kind's (headstart/catalogue.py; heads/draft.py trains one)

    @property
    def dtype(self) -> Any:
        return next(self.model.parameters()).dtype

    @property
    def reads_target_cache(self) -> bool:
        """Early exit: what its layers make of the committed tokens is in the target's own KV
        cache already, so its drafter reads that instead of keeping a cache."""
        return self.early_exit is not None

    @property
    def describe(self) -> str:
        if self.early_exit is not None:
            return f"early exit after layer {self.early_exit} of the target"
        return f"draft model {self.spec}"

    def bind(self, target_model: nn.Module) -> None:
        """Nothing to attach: `load_draft_model` checked the pair."""


def load_draft_model(spec: str, target: Any, *, allow_larger: bool = False) -> DraftModel:
    """The draft named by `spec` for `target`: early-exit:K (the target's first K layers), or
    anything --target takes (a Hub id, a directory, a .gguf, smollm2), loaded in the target's
    dtype on its device. Refused in one line when its tokenizer or its output rows are not the
    target's, when it has no layers (heads.draft.check_draft_pair: what training checks too), and
    when the draft is not smaller than the target unless `allow_larger` (then a warning)."""
    spec = str(spec).strip()
    if not spec:
        raise HeadstartError("--draft-model is empty", f"pass a model (as --target takes) or {EARLY_EXIT}K")
    if spec.startswith(EARLY_EXIT):
        return early_exit(target, _layers(spec, target))
    from headstart.targets import load_target

    dtype = str(target.dtype).removeprefix("torch.")
    try:
        draft = load_target(spec, dtype=dtype, device=str(target.device))
    except HeadstartError as err:
        raise HeadstartError(
            f"draft model: {err.what}", err.fix.replace("--target", "--draft-model")
        ) from None
    check_draft_pair(spec, draft.tokenizer, draft.model.config.to_dict(), target, "--draft-model")
    drafted, verified = _parameters(draft.model), _parameters(target.model)
    if drafted >= verified:
        what = f"the draft model {spec} ({drafted / 1e6:.0f}M parameters) is not smaller than the target ({verified / 1e6:.0f}M)"
        if not allow_larger:
            raise HeadstartError(what, "pick a smaller draft, or pass --draft-larger-ok to try it anyway")
        log.warning(f"warning: {what}: each draft step costs about a target step")
    return DraftModel(draft.model, spec)


def early_exit(target: Any, layers: int) -> DraftModel:
    """The target's first `layers` decoder layers, its final norm and lm_head, as a causal LM of
        its own (the modules shared, not copied; its drafter reads the target's KV cache for those
    layers instead of keeping one: inference/drafters/draft_model.py)."""
    return DraftModel(truncated(target.model, layers), f"{EARLY_EXIT}{layers}", layers, target.model)


# ---- its registration's pieces (headstart/catalogue.py: the `early-exit` draft kind) ----
def load_early_exit(target: Any, spec: str, tree: Any, greedy: bool) -> tuple[DraftModel, Any]:
    """`--draft-model early-exit:K` and its tree (`tree`, else the default chain); a bare
    `early-exit` names no exit layer (a tune stored on this machine would have: speculator.py)."""
    from headstart.inference.trees.spec import choose_tree

    if spec.strip() == EARLY_EXIT.rstrip(":"):
        raise HeadstartError(
            "--draft-model early-exit names no exit layer and no tune on this machine picked one",
            "run `headstart tune --draft-model early-exit` (it measures the exit layer and the tree), or pass early-exit:K",
        )
    choice = choose_tree(tree if tree is not None else DEFAULT_TREE)
    return early_exit(target, _layers(spec, target)), choice if greedy else choice.for_sampling()


def exit_candidates(target: Any) -> list[str]:
    """What a tune of bare `early-exit` compares: exit layers over a quarter to 0.7 of the depth."""
    layers = int(target.num_layers)
    ks = sorted({max(1, min(layers - 1, round(layers * share))) for share in (0.25, 0.4, 0.55, 0.7)})
    return [f"{EARLY_EXIT}{k}" for k in ks]


def default_exit(target: Any) -> str:
    """The bench baseline's exit layer when no tune picked one here: half the depth."""
    return f"{EARLY_EXIT}{max(1, int(target.num_layers) // 2)}"


def truncated(model: nn.Module, layers: int) -> nn.Module:
    """`model` with its first `layers` decoder layers only: shallow copies of the causal LM and its
    decoder with their own module tables and a config saying `layers` (transformers' models loop
    over config.num_hidden_layers layers; per-layer lists in the config are cut to match)."""
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    for name in ("layer_types", "no_rope_layers"):
        value = getattr(config, name, None)
        if isinstance(value, list | tuple):
            setattr(config, name, type(value)(value[:layers]))
    decoder = model.get_decoder()
    inner = copy.copy(decoder)
    inner._modules = dict(decoder._modules)
    inner._modules["layers"] = nn.ModuleList(list(decoder.layers)[:layers])
    inner.config = config
    outer = copy.copy(model)
    outer._modules = {name: inner if module is decoder else module for name, module in model._modules.items()}
    outer.config = config
    if outer.get_decoder() is not inner:
        raise HeadstartError(f"{type(model).__name__}: cannot cut its decoder for early exit",
                             "use a separate --draft-model")  # fmt: skip
    return outer


def _layers(spec: str, target: Any) -> int:
    text = spec.removeprefix(EARLY_EXIT)
    total = int(target.config.num_hidden_layers)
    if not text.isdigit() or not 1 <= int(text) < total:
        raise HeadstartError(
            f"bad early exit '{spec}': the target has {total} layers",
            f"use {EARLY_EXIT}K with 1 <= K < {total}, e.g. {EARLY_EXIT}{max(1, total // 4)}",
        )
    return int(text)


def _parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
