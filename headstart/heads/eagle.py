"""EAGLE-1/2 and EAGLE-3 heads: one decoder layer of the target's architecture that guesses the
target's next feature from (next token, current feature); see headstart.heads.base for alignment.

EAGLE-3 comes in two layouts (HeadConfig.layout):
- "reference" (new heads): the EAGLE-3 release's layout, which vLLM, SGLang, speculators,
  SpecForge and llama.cpp read: fc (3H -> H) fuses three target layers into g; the layer's q/k/v
  read cat(input_layernorm(embed), hidden_norm(g)) (2H); the residual is g. `headstart export`
  writes it in their formats (headstart/heads/formats/).
- "fc" (headstart's first layout, kept so older checkpoints load): fc(cat(norm(embed), norm(g)))
  (2H -> H) feeds a standard decoder layer. No serving engine reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from headstart.errors import HeadstartError
from headstart.heads.checkpoint import HeadCheckpoint
from headstart.heads.config import SHAPE, HeadConfig
from headstart.heads.layer import DraftLayer
from headstart.heads.vocab import DraftVocab


def eagle3_fields(spec: Any, target: Any) -> dict[str, Any]:
    """What both EAGLE-3 layouts take from a recipe: draft layers, EAGLE-3.1's fc norms, and a
    draft layer of another architecture than the target's (head.draft_layer=qwen3)."""
    from headstart.heads.dflash import derived_draft_config

    other = spec.draft_layer == "qwen3"
    config = target.model.config.to_dict()
    return {
        "num_layers": spec.num_layers,
        "fc_norm": spec.fc_norm,
        "draft_config": derived_draft_config(config, target.hidden_size, target.vocab_size, spec.num_layers)
        if other
        else {},
    }


@dataclass
class EagleOptions:
    """EAGLE-1's own `head.*` keys (HeadSpec.options for head.kind=eagle)."""

    input_norms: bool = True
    """The fc layout: RMS-normalise the token embedding and the feature separately before they are
    fused (EAGLE-3's reference does). SmolLM2's middle/deep features are ~500x the embeddings'
    scale; without the norms the head all but ignores the token it is given."""


@dataclass
class Eagle3Options(EagleOptions):
    """EAGLE-3's own `head.*` keys (HeadSpec.options for head.kind=eagle3)."""

    fc_norm: bool = False
    """The reference layout: an RMS norm on each tapped target state before fc (EAGLE-3.1;
    speculators' `fc_norm`, weights fc_norm.{i}.weight). SmolLM2's middle and deep states are
    ~500x the shallow one's scale: unnormed, fc sees mostly them. Exported to speculators only."""
    draft_layer: Literal["target", "qwen3"] = "target"
    """The reference layout: the draft layer's architecture: the target's own decoder layer
    class, or Qwen3's (RMS norms on each head's queries and keys) at the target's sizes. Exported
    to speculators only (the EAGLE release's readers build Llama layers)."""


@dataclass
class EagleConfig:
    """EAGLE-1's own fields of a checkpoint's config.json (HeadConfig.options for kind eagle)."""

    input_norms: bool = field(default=False, metadata=SHAPE)
    """Norms on the embedding and the feature before fc (EagleOptions.input_norms; False:
    checkpoints made before they existed, which have none)."""


@dataclass
class Eagle3Config(EagleConfig):
    """EAGLE-3's own fields of a checkpoint's config.json (HeadConfig.options for kind eagle3)."""

    fc_norm: bool = field(default=False, metadata=SHAPE)
    """The reference layout: an RMS norm on each tapped state before fc (Eagle3Options.fc_norm)."""
    own_embeddings: bool = False
    """Imported: the checkpoint ships its own token embeddings (`embed_tokens.weight`) instead of
    sharing the target's."""
    draft_config: dict[str, Any] = field(default_factory=dict, metadata=SHAPE)
    """A draft layer of another architecture (Eagle3Options.draft_layer): its transformers config
    (sizes from the target when built, as given when imported). Empty: the target's own layer,
    built from target_config."""


class EagleHead(HeadCheckpoint, nn.Module):
    """EAGLE-1/2: g_t = layer(fc([norm(embed(x_{t+1})); norm(h_t)])); the target's lm_head maps g
    to tokens (no norms in checkpoints saved before `input_norms`)."""

    kind = "eagle"

    @staticmethod
    def spec_fields(spec: Any, target: Any) -> dict[str, Any]:
        """A recipe's `head:` as this kind's HeadConfig fields (headstart.heads.build.head_config)."""
        if spec.draft_vocab_size:
            raise HeadstartError(
                "head.draft_vocab_size is not used by eagle (EAGLE-1 drafts through the target's lm_head)",
                "remove head.draft_vocab_size, or use head.kind=eagle3",
            )
        return {"draft_vocab_size": target.vocab_size, "input_norms": spec.input_norms}

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.feature_layers: tuple[int, ...] = tuple(config.feature_layers)
        self.draft_vocab_size = config.draft_vocab_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.midlayer = DraftLayer(config.target_config)
        # Separate norms, so neither input swamps the other in fc (see HeadSpec.input_norms).
        self.embed_norm = self.midlayer.new_norm() if config.input_norms else None
        self.hidden_norm = self.midlayer.new_norm() if config.input_norms else None
        self._bound: dict[str, nn.Module] = {}

    def bind(self, target_model: Any) -> None:
        """Frozen references to the target's token embeddings and lm_head (not saved)."""
        self._bound["embed"] = target_model.get_input_embeddings()
        self._bound["lm_head"] = target_model.get_output_embeddings()

    def init_from_target(self, target_model: Any) -> None:
        """Nothing to copy for EAGLE-1: its vocabulary projection is the target's."""

    def bound(self, name: str) -> nn.Module:
        if name not in self._bound:
            raise HeadstartError(
                f"{self.kind} head is not bound to a target (no {name})", "call head.bind(target.model)"
            )
        return self._bound[name]

    def fuse(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor]) -> torch.Tensor:
        return last_hidden

    def forward(
        self,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        *,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        keys_only: bool = False,
    ) -> torch.Tensor | None:
        """hidden (B, T, H), next tokens (B, T) -> g (B, T, H); see DraftHead in base.py.
        `keys_only`: only cache the positions' keys and values (DraftLayer.forward), return None."""
        embeds = self.bound("embed")(input_ids).to(hidden.dtype)  # (B, T, H), frozen
        if self.embed_norm is not None and self.hidden_norm is not None:
            embeds, hidden = self.embed_norm(embeds), self.hidden_norm(hidden)
        x = self.fc(torch.cat([embeds, hidden], dim=-1))  # (B, T, H)
        return self.midlayer(
            x,
            position_ids=position_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            keys_only=keys_only,
        )

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return self.bound("lm_head")(g)  # (B, T, V)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids

    def new_cache(self) -> Any:
        return self.midlayer.new_cache()


class Eagle3FcHead(DraftVocab, EagleHead):
    """EAGLE-3 in headstart's first ("fc") layout: fuses three target layers (3H -> H), then the
    EAGLE-1 path, then its own norm and lm_head over a draft vocabulary of Vd tokens, with d2t
    (target_id = i + d2t[i]) and t2d (bool, V) maps."""

    options: tuple[str, ...] = ()  # one draft layer, no norms on the taps

    kind = "eagle3"

    @staticmethod
    def spec_fields(spec: Any, target: Any) -> dict[str, Any]:
        return {"layout": "fc", "input_norms": spec.input_norms, **eagle3_fields(spec, target)}

    def __init__(self, config: HeadConfig) -> None:
        super().__init__(config)
        hidden, draft = config.hidden_size, config.draft_vocab_size
        self.fuse_fc = nn.Linear(len(config.feature_layers) * hidden, hidden, bias=False)
        self.norm = self.midlayer.new_norm()
        self.lm_head = nn.Linear(hidden, draft, bias=False)
        # Identity maps until `set_draft_vocab`; saved with the weights (vLLM's convention).
        self.init_draft_vocab(draft, config.vocab_size)

    def init_from_target(self, target_model: Any) -> None:
        """Start from the target's final norm and the draft-vocabulary rows of its lm_head."""
        with torch.no_grad():
            weight = target_model.get_output_embeddings().weight
            self.lm_head.weight.copy_(weight[self.draft_ids().to(weight.device)])
            norm = getattr(target_model.get_decoder(), "norm", None)
            if norm is not None and same_function(norm, self.norm):
                self.norm.load_state_dict(norm.state_dict())

    def fuse(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor]) -> torch.Tensor:
        missing = [i for i in self.feature_layers if i not in layers]
        if missing:
            raise HeadstartError(
                f"eagle3 head needs target layers {missing}", f"capture layers {list(self.feature_layers)}"
            )
        taps = [layers[i] for i in self.feature_layers]
        norms = getattr(self, "fc_norm", None)  # EAGLE-3.1 (reference layout, HeadSpec.fc_norm)
        if norms is not None:
            taps = [norm(x) for norm, x in zip(norms, taps, strict=True)]
        return self.fuser(torch.cat(taps, dim=-1))  # (B, T, H)

    @property
    def fuser(self) -> nn.Module:
        """The 3H -> H projection (named fuse_fc in this layout, fc in the reference one)."""
        return self.fuse_fc

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(g))  # (B, T, Vd)


class Eagle3Head(Eagle3FcHead):
    """EAGLE-3 in the reference layout (module docstring). Module names mirror the reference's
    (`fc`, `norm`, `lm_head`, `d2t`, `t2d`; `midlayer.layer.*` is its `midlayer.*`/`layers.0.*`),
    so the format adapters (headstart/heads/formats/) only rename. `embed_tokens` exists only for imported heads that ship their own
    token embeddings; otherwise the target's are bound, frozen and not saved."""

    layout = "reference"
    options: tuple[str, ...] = ("num_layers", "fc_norm", "draft_layer")
    relayout_from = {"fc": ("layout", "input_norms")}
    """A warm start (init_from) from heads of these layouts of the kind, and the config fields
    that may then differ: `relayout` rebuilds the head around them (headstart.heads.relayout)."""

    @staticmethod
    def relayout(
        old: nn.Module, fresh: nn.Module, target: Any, conversations: list[torch.Tensor]
    ) -> nn.Module:
        """`fresh` warm-started from fc-layout heads `old`, the scales of the norms the reference
        layout adds measured on `conversations` (cost: one target forward each)."""
        import logging

        from headstart.heads.relayout import calibrate, reference_from_fc, sample_for_calibration

        with torch.no_grad():
            scales = calibrate(old, *sample_for_calibration(old, target, conversations))
        logging.getLogger("headstart.heads").info("warm start from the fc layout: %s", scales)
        return reference_from_fc(old, fresh, scales)

    @staticmethod
    def spec_fields(spec: Any, target: Any) -> dict[str, Any]:
        # the reference layout has its input norms built in
        return {"layout": "reference", "input_norms": False, **eagle3_fields(spec, target)}

    def __init__(self, config: HeadConfig) -> None:
        nn.Module.__init__(self)
        self.config = config
        hidden, draft = config.hidden_size, config.draft_vocab_size
        self.feature_layers = tuple(config.feature_layers)
        self.fc = nn.Linear(len(config.feature_layers) * hidden, hidden, bias=False)
        # the draft layer's own architecture (HeadSpec.draft_layer) or the target's
        layer_config = config.draft_config or config.target_config
        self.midlayer = DraftLayer(layer_config, eagle3_input=True, layers=config.num_layers)
        self.norm = self.midlayer.new_norm()
        # EAGLE-3.1: each tapped state normed before fc (HeadSpec.fc_norm)
        self.fc_norm = (
            nn.ModuleList(self.midlayer.new_norm() for _ in config.feature_layers) if config.fc_norm else None
        )
        self.lm_head = nn.Linear(hidden, draft, bias=False)
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden) if config.own_embeddings else None
        self.embed_norm = self.hidden_norm = None
        self._bound = {}
        self.init_draft_vocab(draft, config.vocab_size)

    @property
    def fuser(self) -> nn.Module:
        return self.fc

    @torch.no_grad()
    def init_layers_from_target(self, target_model: Any) -> list[str]:
        """A warm start (`head.init_layers: target`): the draft layer starts as the target layer
        that reads the deepest tap (id d is block d's output, so layer d + 1; a second draft layer
        as layer d + 2, ...), fc passes that tap through, and the first layer's q/k/v read only the
        hidden half of cat(embed, hidden) with the donor's weights (the embedding half starts at 0,
        and hidden_norm is the donor's input norm). At step 0 the head is then the target's own
        layer d + 1 with the target's final norm and lm_head: an early exit, which training moves
        towards the next token's distribution. Returns the names left at their fresh values."""
        from headstart.heads.layer import EAGLE3_PROJECTIONS, copy_alike, same_norm
        from headstart.targets.features import decoder_layers

        source, deepest = decoder_layers(target_model), max(self.feature_layers)
        layers = [self.midlayer.layer, *self.midlayer.more]
        if deepest + len(layers) >= len(source):
            raise HeadstartError(
                f"head.init_layers=target copies target layers {deepest + 1}..{deepest + len(layers)} (after the "
                f"deepest tap, {deepest}), but the target has layers 0..{len(source) - 1}",
                "tap a lower layer (head.feature_layers), draft with fewer layers, or set head.init_layers=random",
            )
        left = []
        for index, layer in enumerate(layers):
            prefix = "midlayer.layer." if index == 0 else f"midlayer.more.{index - 1}."
            left += [prefix + name for name in copy_alike(layer, source[deepest + 1 + index])]
        first, donor = layers[0], source[deepest + 1]
        for name in EAGLE3_PROJECTIONS:
            wide, theirs = getattr(first.self_attn, name), getattr(donor.self_attn, name)
            wide.weight.zero_()
            wide.weight[:, theirs.in_features :] = theirs.weight.to(wide.weight.dtype)
            if wide.bias is not None and theirs.bias is not None:
                wide.bias.copy_(theirs.bias.to(wide.bias.dtype))
            left = [n for n in left if not n.startswith(f"midlayer.layer.self_attn.{name}.")]
        norm = getattr(donor, "input_layernorm", None)
        if norm is not None and same_norm(norm, first.hidden_norm):
            first.hidden_norm.weight.copy_(norm.weight.to(first.hidden_norm.weight.dtype))
            left.remove("midlayer.layer.hidden_norm.weight")
        hidden, slot = self.config.hidden_size, self.feature_layers.index(deepest)
        self.fc.weight.zero_()
        self.fc.weight[:, slot * hidden : (slot + 1) * hidden] = torch.eye(hidden, dtype=self.fc.weight.dtype)
        return left

    def forward(
        self,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        *,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        keys_only: bool = False,
    ) -> torch.Tensor | None:
        """hidden (B, T, H) (fused, or the previous step's g), next tokens (B, T) -> g (B, T, H).
        `keys_only`: only cache the positions' keys and values (DraftLayer.forward), return None."""
        embed = self.embed_tokens if self.embed_tokens is not None else self.bound("embed")
        embeds = embed(input_ids).to(hidden.dtype)  # (B, T, H), frozen
        return self.midlayer(
            hidden,
            embeds=embeds,
            position_ids=position_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            keys_only=keys_only,
        )


def same_function(norm: nn.Module, other: nn.Module) -> bool:
    """Whether `other` with `norm`'s weights computes what `norm` does (a Qwen3 draft layer's
    norm for a Llama target does; Gemma's 1 + w norm does not), checked on a probe. Nothing of
    `other` changes."""
    if type(norm) is type(other):
        return True
    mine, theirs = other.state_dict(), norm.state_dict()
    if mine.keys() != theirs.keys() or any(mine[k].shape != theirs[k].shape for k in mine):
        return False
    import copy

    probe = copy.deepcopy(other)
    probe.load_state_dict(theirs)
    weight = next(iter(theirs.values()))
    x = torch.randn(2, weight.shape[-1], generator=torch.Generator().manual_seed(0)).to(weight)
    return bool(torch.allclose(probe(x), norm(x), rtol=1e-4, atol=1e-5))
