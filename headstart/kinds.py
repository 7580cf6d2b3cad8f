"""Head kinds, registered by name: where each kind's pieces live in every layer. A new kind adds
its files (a head module, a drafter module, a training objective, a format adapter if it has one)
and ONE `register(HeadKind(...))` line in headstart/catalogue.py; nothing else in the package
names kinds (docs/developer/add-a-head-kind.md).

This module is the registry alone, a leaf: every layer may ask it (heads/config.py checks a
recipe's kind, the decoder finds a drafter) without importing any kind. The pieces are named by
"module:attribute" and imported when first asked for; the registrations that name them live one
level up, in the catalogue, which `import headstart` runs (strings only: it loads nothing heavy)."""

from __future__ import annotations

import dataclasses
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
    """Layout -> "module:Class" of its nn.Module, the default layout first (most kinds have one
    layout, "fc")."""
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
    joint_lora: str = ""
    """Its loss in words when it trains the target jointly through LoRA adapters ("Medusa-2 (joint
    LoRA)"); empty: it cannot."""
    free_on_init: tuple[str, ...] = ()
    """Shape fields a warm start (init_from) may change: the head is rebuilt around them."""
    head_section: str | None = None
    """"module:Class" of the dataclass holding its own `head.*` keys (Medusa's num_heads, DFlash's
    block_size): a recipe's `head:` keys beyond HeadSpec's shared ones are read into it, and read
    back as `spec.KEY`. None: the kind has no keys of its own."""
    loss_section: str | None = None
    """"module:Class" of the dataclass holding the `loss.*` keys its objective reads (`cfg.loss` is
    one of these). A key of another kind's section set away from its default is refused, naming
    the kinds that take it."""
    config_section: str | None = None
    """"module:Class" of the dataclass holding its own fields of a checkpoint's config.json
    (Medusa's num_heads, DFlash's block_size; HeadConfig.options), written beside the shared ones;
    a field marked `headstart.heads.config.SHAPE` must match for a warm start (init_from). Files
    written before the sections hold every kind's fields: another kind's at its default is dropped."""

    @property
    def default_layout(self) -> str:
        """The layout a recipe that names none builds (the first of `heads`)."""
        return next(iter(self.heads))

    def head_class(self, layout: str = "fc") -> type:
        if layout not in self.heads:
            raise HeadstartError(
                f"{self.name} heads have no '{layout}' layout", f"use head.layout={' or '.join(self.heads)}"
            )
        return load(self.heads[layout])

    def section(self, which: str) -> type | None:
        """Its `head`, `loss` or `config` section's class (None: it has no keys of its own there)."""
        ref = {"head": self.head_section, "loss": self.loss_section, "config": self.config_section}[which]
        return load(ref) if ref else None


@dataclass(frozen=True)
class DraftKind:
    """A drafter with nothing to train, named by `--draft-model NAME[:OPTIONS]` (Lookahead
    decoding, the target's own early exit); a model (a path, a Hub id) is no kind: it drafts as
    itself. Its pieces, as "module:function", live in its own modules."""

    name: str
    """What --draft-model names it by (before any ':')."""
    load: str
    """(target, spec, tree: str | None, greedy: bool) -> (what the decoder takes where it takes
    heads, its TreeChoice); refuses a bad spec or a --tree it cannot use in one line."""
    candidates: str
    """(target) -> the specs `headstart tune --draft-model NAME` compares (its sizes, exit layers)."""
    default: str
    """(target) -> the spec its bench baseline decodes with when no tune stored one here."""
    baseline: str
    """The `headstart bench --baselines` name that measures it."""
    own_tree: bool = False
    """It builds its own tree each step: --tree does not apply and a tune compares specs only."""
    check: str | None = None
    """(spec) -> raises HeadstartError for a spec it would refuse (a stored tune's is checked)."""


KINDS: dict[str, HeadKind] = {}
DRAFT_KINDS: dict[str, DraftKind] = {}
DEFAULT = "medusa"
"""The kind a recipe's `head:` section gets when it names none."""


def register(kind: HeadKind) -> HeadKind:
    """Make `kind` known by its name (a later registration of the same name replaces it)."""
    KINDS[kind.name] = kind
    return kind


def register_draft(kind: DraftKind) -> DraftKind:
    """Make a drafter with nothing to train known by its name."""
    DRAFT_KINDS[kind.name] = kind
    return kind


def draft_kind(spec: str) -> DraftKind | None:
    """The draft kind a --draft-model value names (its part before ':'); None for a model."""
    return DRAFT_KINDS.get(str(spec).strip().partition(":")[0])


def get(name: str) -> HeadKind:
    """The kind called `name`, or one line naming the known ones."""
    if name not in KINDS:
        raise HeadstartError(f"unknown head kind '{name}'", f"use one of {', '.join(KINDS)}")
    return KINDS[name]


def section_keys(which: str) -> dict[str, list[tuple[str, Any]]]:
    """Every registered kind's `head`, `loss` or `config` section keys: key -> [(kind, its default)] (what a
    recipe's key for another kind is refused against, headstart.config.section)."""
    keys: dict[str, list[tuple[str, Any]]] = {}
    for kind in KINDS.values():
        cls = kind.section(which)
        for f in dataclasses.fields(cls) if cls is not None else ():
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
            keys.setdefault(f.name, []).append((kind.name, default))
    return keys


def names() -> tuple[str, ...]:
    return tuple(KINDS)


def load(ref: str) -> Any:
    """The attribute a "module:attribute" reference names."""
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)
