"""Head kinds, registered by name: where each kind's pieces live in every layer. A new kind adds
its files (a head module, a drafter module, a training objective, a format adapter if it has one)
and ONE `register(HeadKind(...))` line; nothing else in the package names kinds
(docs/developer/add-a-head-kind.md).

The pieces above this package (the drafter in inference/, the objective in train/) are named by
"module:attribute" and imported when first asked for, so heads/ never imports the layers that use
it."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from headstart.errors import HeadstartError


@dataclass(frozen=True)
class HeadKind:
    """One kind of draft head and where its pieces live."""

    name: str
    """The `head.kind` recipes and checkpoints name."""
    heads: dict[str, str]
    """Layout -> "module:Class" of its nn.Module (most kinds have one layout, "fc")."""
    drafter: str
    """"module:Class" of its drafter (the decoder's view of it: headstart.inference.drafters.Drafter)."""
    objective: str
    """"module:function" of its training loss, `(objective, feats, batch, evaluate, joint) ->
    {"loss", "parts"[, "hits"]}`, with `.parts(cfg)` naming the parts and an optional
    `.full_logits` (headstart/train/objectives/__init__.py)."""
    loss: str
    """The loss in words for `train --dry-run`, formatted with the recipe as `cfg`."""
    formats: tuple[str, ...] = ("headstart",)
    """The `headstart export --format`s it can be written in."""
    reads_layers: bool = False
    """It reads tapped target layers (head.feature_layers), not only the last hidden state."""
    metric_step: str = "step"
    """What its per-depth metrics are named by: `step` (an unrolled step) or `head` (Medusa's k)."""
    taps: tuple[int, int | None] | None = None
    """How many target layers head.feature_layers must name, (least, most or None): EAGLE-3 3,
    DFlash 1 or more; None: the kind reads no tapped layers."""
    trees: str = "dynamic"
    """The trees `headstart tune` tries: `static` (fixed-depth heads: chains, forked and the
    default static tree), `dynamic` (autoregressive drafters: EAGLE-2's dynamic trees too) or
    `block` (one forward drafts every depth: deeper dynamic trees cost no extra draft pass)."""
    joint_lora: bool = False
    """It can train the target jointly through LoRA adapters (Medusa-2)."""
    free_on_init: tuple[str, ...] = ()
    """Shape fields a warm start (init_from) may change: the head is rebuilt around them."""

    def head_class(self, layout: str = "fc") -> type:
        if layout not in self.heads:
            raise HeadstartError(
                f"{self.name} heads have no '{layout}' layout", f"use head.layout={' or '.join(self.heads)}"
            )
        return load(self.heads[layout])


KINDS: dict[str, HeadKind] = {}
DEFAULT = "medusa"
"""The kind a recipe's `head:` section gets when it names none."""


def register(kind: HeadKind) -> HeadKind:
    """Make `kind` known by its name (a later registration of the same name replaces it)."""
    KINDS[kind.name] = kind
    return kind


def get(name: str) -> HeadKind:
    """The kind called `name`, or one line naming the known ones."""
    if name not in KINDS:
        raise HeadstartError(f"unknown head kind '{name}'", f"use one of {', '.join(KINDS)}")
    return KINDS[name]


def names() -> tuple[str, ...]:
    return tuple(KINDS)


def load(ref: str) -> Any:
    """The attribute a "module:attribute" reference names."""
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


register(HeadKind("medusa", {"fc": "headstart.heads.medusa:MedusaHeads"}, "headstart.inference.drafters.medusa:MedusaDrafter", "headstart.train.objectives.medusa:medusa_loss", "Medusa-1 (per-head CE)", ("medusa", "headstart"), metric_step="head", trees="static", joint_lora=True, free_on_init=("draft_vocab_size",)))  # fmt: skip
register(HeadKind("eagle", {"fc": "headstart.heads.eagle:EagleHead"}, "headstart.inference.drafters.eagle:EagleDrafter", "headstart.train.objectives.eagle:eagle1_loss", "EAGLE-1 (SmoothL1 features + CE)"))  # fmt: skip
register(HeadKind("eagle3", {"fc": "headstart.heads.eagle:Eagle3FcHead", "reference": "headstart.heads.eagle:Eagle3Head"}, "headstart.inference.drafters.eagle:EagleDrafter", "headstart.train.objectives.eagle:eagle3_loss", "EAGLE-3 training-time test ({cfg.loss.ttt_steps} steps)", ("speculators", "eagle", "headstart"), reads_layers=True, taps=(3, 3)))  # fmt: skip
register(HeadKind("dflash", {"fc": "headstart.heads.dflash:DFlashHead"}, "headstart.inference.drafters.dflash:DFlashDrafter", "headstart.train.objectives.dflash:dflash_loss", "DFlash blocks of {cfg.head.block_size} ({cfg.loss.dflash_anchors} anchors a conversation, {cfg.loss.dflash_labels} CE, slot decay)", ("speculators", "dflash", "headstart"), reads_layers=True, taps=(1, None), trees="block"))  # fmt: skip
register(HeadKind("draft_model", {"fc": "headstart.heads.draft:DraftLM"}, "headstart.inference.drafters.draft_model:DraftModelDrafter", "headstart.train.objectives.draft:draft_loss", "KL to the target's next-token distribution (a draft model of {cfg.head.num_layers} layers)", metric_step="step", trees="dynamic"))  # fmt: skip
