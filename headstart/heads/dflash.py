"""DFlash: a block drafter (z-lab 2026; speculators `dflash`, llama.cpp `draft-dflash`, SGLang).

A few decoder layers read the target's fused features at the committed positions as CONTEXT and
a block of B tokens, [anchor, mask, ..., mask] at positions a..a+B-1, as QUERIES; one forward
gives a distribution at every block position: slot k guesses the token at a+k (slot 0 is the
anchor, already known). Attention inside the block is bidirectional; the block sees the context
strictly before its anchor. The context enters as keys and values only, through each layer's own
k/v projections (k normalised and rotated, v not): it never runs through a layer's MLP, and it
is the same for every layer (the features are not updated by the draft layers).

    g   = hidden_norm(fc(cat(target layers)))         (T, H): the context
    x_0 = embed([anchor, mask, ...])                   (B, H): the target's embeddings, frozen
    x_l = layer_l(x_{l-1}; keys/values = [k_l(g), k_l(x_{l-1})], [v_l(g), v_l(x_{l-1})])
    logits = lm_head(norm(x_L))                        the target's lm_head, frozen

Layers are transformers' Qwen3 decoder layers (q/k norms), sized from the target (hidden, heads,
head_dim, intermediate, rms eps, rope theta): what speculators, z-lab and llama.cpp run, and for a
Qwen3 target its own class. No modeling code is copied: the context's keys and values go into a
transformers KV cache, and the block runs through the layers' own forward with a 4D mask, as the
verifier's tree does. Module names are speculators' and z-lab's (fc, hidden_norm, layers.N.*,
norm), so the format adapters copy the state dict as it is.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from headstart.errors import HeadstartError
from headstart.heads.checkpoint import HeadCheckpoint
from headstart.heads.config import SHAPE, HeadConfig, HeadSpec
from headstart.heads.layer import copy_alike, same_norm
from headstart.heads.vocab import DraftVocab
from headstart.targets.features import cache_keyword, tree_attention_mask

DRAFT_ARCH = "qwen3"
"""The draft layers' transformers model type (the layer every DFlash runtime builds)."""


def rope_theta(target_config: dict[str, Any]) -> float:
    """The target's (global) rope theta: the draft's positions are absolute, like the target's."""
    params = target_config.get("rope_parameters") or {}
    if isinstance(params.get("full_attention"), dict):  # per layer kind (Gemma 3): the global one
        params = params["full_attention"]
    return float(params.get("rope_theta") or target_config.get("rope_theta") or 10000.0)


def derived_draft_config(
    target_config: dict[str, Any], hidden: int, vocab: int, layers: int
) -> dict[str, Any]:
    """The draft layers' transformers config for a target: Qwen3 layers of the target's sizes
    (hidden, heads, head_dim, intermediate, rms eps, rope theta), full attention."""
    heads = int(target_config["num_attention_heads"])
    return {
        "model_type": DRAFT_ARCH,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(target_config.get("intermediate_size") or 4 * hidden),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(target_config.get("num_key_value_heads") or heads),
        "head_dim": int(target_config.get("head_dim") or hidden // heads),
        "rms_norm_eps": float(target_config.get("rms_norm_eps") or 1e-6),
        "max_position_embeddings": int(target_config.get("max_position_embeddings") or 32768),
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta(target_config)},
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "layer_types": ["full_attention"] * layers,
    }


def draft_layers_config(config: HeadConfig) -> Any:
    """The draft layers' transformers config object (sdpa: it passes our 4D float masks through)."""
    from transformers import AutoConfig

    data = dict(config.draft_config) or derived_draft_config(
        config.target_config, config.hidden_size, config.vocab_size, config.num_layers
    )
    model_type = data.pop("model_type", DRAFT_ARCH)
    if model_type != DRAFT_ARCH:
        raise HeadstartError(
            f"dflash draft layers of type {model_type!r}: headstart runs {DRAFT_ARCH} layers (q/k norms), "
            "as speculators, z-lab and llama.cpp do",
            "use a DFlash head with qwen3 draft layers",
        )
    layer = AutoConfig.for_model(model_type, **data)
    layer._attn_implementation = "sdpa"
    return layer


def mask_token(spec: HeadSpec, target: Any) -> int:
    """DFlash's mask token: head.mask_token_id, else the tokenizer's mask, pad or end token. Any
    fixed id works (the draft learns what its frozen embedding means in a block); every runtime
    reads the id from the checkpoint."""
    vocab = target.vocab_size
    if spec.mask_token_id is not None:
        if not 0 <= spec.mask_token_id < vocab:
            raise HeadstartError(
                f"head.mask_token_id={spec.mask_token_id} is not a token of the target (0..{vocab - 1})",
                "pick an id in the vocabulary, or leave head.mask_token_id unset",
            )
        return spec.mask_token_id
    tokenizer = getattr(target, "tokenizer", None)
    for name in ("mask_token_id", "pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int) and 0 <= value < vocab:
            return value
    return vocab - 1


@dataclass
class DFlashOptions:
    """DFlash's own `head.*` keys (HeadSpec.options for head.kind=dflash)."""

    block_size: int = 16
    """Tokens per block, the anchor included (block_size - 1 drafted per forward)."""
    mask_token_id: int | None = None
    """The token id whose (frozen, target) embedding fills the block's mask slots; None: the
    tokenizer's mask token, else its pad token, else its end-of-sequence token."""

    def __post_init__(self) -> None:
        if not 2 <= self.block_size <= 64:
            raise HeadstartError(
                f"head.block_size must be in 2..64, got {self.block_size}", "set head.block_size=16"
            )


@dataclass
class DFlashConfig:
    """DFlash's own fields of a checkpoint's config.json (HeadConfig.options for kind dflash)."""

    block_size: int = 0
    """Tokens per block, the anchor included (0: none recorded, refused by DFlashHead.check_config)."""
    mask_token_id: int = -1
    """The token whose embedding fills the block's mask slots."""
    draft_config: dict[str, Any] = field(default_factory=dict, metadata=SHAPE)
    """The draft layers' transformers config (model_type qwen3; sizes from the target when built,
    as given when imported)."""

    def card(self) -> str:
        """Its part of the model card's head line."""
        return (f"block {self.block_size} (one forward drafts {self.block_size - 1} tokens), "
                f"mask token {self.mask_token_id}")  # fmt: skip


class DFlashHead(DraftVocab, HeadCheckpoint, nn.Module):
    """The block drafter (module docstring). Bound to the target's embeddings and lm_head (not
    saved). With a draft vocabulary, training scores and drafting proposes only its Vd tokens,
    through those rows of the target's lm_head (Medusa's arrangement): the checkpoint holds no
    lm_head of its own (the speculators export writes those rows out, with d2t/t2d, as speculators
    saves a reduced vocabulary)."""

    @classmethod
    def check_config(cls, config: HeadConfig) -> None:
        if not (
            config.block_size >= 2 and config.feature_layers and 0 <= config.mask_token_id < config.vocab_size
        ):
            raise HeadstartError(
                f"a dflash head needs block_size >= 2, feature layers and a mask token in the vocabulary "
                f"(got {config.block_size}, {config.feature_layers}, {config.mask_token_id})",
                "rebuild the head from a recipe with head.kind=dflash",
            )

    kind = "dflash"

    @staticmethod
    def spec_fields(spec: Any, target: Any) -> dict[str, Any]:
        """A recipe's `head:` as this kind's HeadConfig fields (headstart.heads.build.head_config)."""
        return {
            "num_layers": spec.num_layers,
            "block_size": spec.block_size,
            "mask_token_id": mask_token(spec, target),
            "draft_config": derived_draft_config(
                target.model.config.to_dict(), target.hidden_size, target.vocab_size, spec.num_layers
            ),
        }

    def __init__(self, config: HeadConfig) -> None:
        from headstart.heads.layer import layer_classes

        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.feature_layers: tuple[int, ...] = tuple(config.feature_layers)
        self.block_size = self.draft_slots = config.block_size  # its block follows the context
        self.mask_token_id = config.mask_token_id
        self.layer_config = draft_layers_config(config)
        layer_cls, rotary_cls, norm_cls = layer_classes(self.layer_config)
        eps = self.layer_config.rms_norm_eps
        self.fc = nn.Linear(len(self.feature_layers) * hidden, hidden, bias=False)
        self.hidden_norm = norm_cls(hidden, eps=eps)
        self.layers = nn.ModuleList(
            layer_cls(self.layer_config, layer_idx=i) for i in range(config.num_layers)
        )
        self.norm = norm_cls(hidden, eps=eps)
        self.rotary_emb = rotary_cls(config=self.layer_config)
        self._rope = sys.modules[type(self.layers[0].self_attn).__module__].apply_rotary_pos_emb
        self._cache_keyword = cache_keyword(layer_cls.forward)
        self._bound: dict[str, nn.Module] = {}
        self._rows: tuple[tuple[int, int, int], torch.Tensor] | None = None
        self.init_draft_vocab(config.draft_vocab_size, config.vocab_size, always=False)

    @property
    def has_draft_vocab(self) -> bool:
        return self.draft_vocab_size < self.config.vocab_size

    @property
    def max_depth(self) -> int:
        """How deep one block drafts: B - 1 tokens after the anchor."""
        return self.block_size - 1

    def bind(self, target_model: Any) -> None:
        """Frozen references to the target's token embeddings and lm_head (not saved)."""
        self._bound["embed"] = target_model.get_input_embeddings()
        self._bound["lm_head"] = target_model.get_output_embeddings()

    def init_from_target(self, target_model: Any) -> None:
        """The final norm starts as the target's (its lm_head reads normed states)."""
        norm = getattr(target_model.get_decoder(), "norm", None)
        if norm is not None and type(norm) is type(self.norm):
            with torch.no_grad():
                self.norm.load_state_dict(norm.state_dict())

    @torch.no_grad()
    def init_layers_from_target(self, target_model: Any) -> list[str]:
        """A warm start (`head.init_layers: target`): draft layer i starts as the target layer
        that reads the deepest tap (id d is block d's output, so layer d + 1 + i), fc passes
        that tap through and hidden_norm is that layer's input norm, so the context's values begin
        as the target's own there (keys too, but for Qwen3's per-head k_norm). Copies every parameter whose name and shape
        agree (attention and MLP projections; norms only where they compute alike: Gemma's 1 + w
        RMSNorm does not); returns the names it left at their fresh values."""
        from headstart.targets.features import decoder_layers

        source = decoder_layers(target_model)
        deepest = max(self.feature_layers)
        if deepest + len(self.layers) >= len(source):
            raise HeadstartError(
                f"head.init_layers=target copies target layers {deepest + 1}..{deepest + len(self.layers)} (after "
                f"the deepest tap, {deepest}), but the target has layers 0..{len(source) - 1}",
                "tap a lower layer (head.feature_layers), draft with fewer layers, or set head.init_layers=random",
            )
        left: list[str] = []
        for index, layer in enumerate(self.layers):
            left += [f"layers.{index}.{name}" for name in copy_alike(layer, source[deepest + 1 + index])]
        hidden = self.config.hidden_size
        slot = self.feature_layers.index(deepest)
        self.fc.weight.zero_()
        self.fc.weight[:, slot * hidden : (slot + 1) * hidden] = torch.eye(hidden, dtype=self.fc.weight.dtype)
        norm = getattr(source[deepest + 1], "input_layernorm", None)
        if norm is not None and same_norm(norm, self.hidden_norm):
            self.hidden_norm.weight.copy_(norm.weight.to(self.hidden_norm.weight.dtype))
        else:
            left.append("hidden_norm.weight")
        return left

    def bound(self, name: str) -> nn.Module:
        if name not in self._bound:
            raise HeadstartError(
                f"{self.kind} head is not bound to a target (no {name})", "call head.bind(target.model)"
            )
        return self._bound[name]

    def fuse(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor]) -> torch.Tensor:
        """Target layers -> the context g (B, T, H)."""
        missing = [i for i in self.feature_layers if i not in layers]
        if missing:
            raise HeadstartError(
                f"dflash head needs target layers {missing}", f"capture layers {list(self.feature_layers)}"
            )
        return self.hidden_norm(self.fc(torch.cat([layers[i] for i in self.feature_layers], dim=-1)))

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.layer_config)

    def add_context(self, g: torch.Tensor, position_ids: torch.Tensor, cache: Any) -> None:
        """Append the context g (B, T, H) at `position_ids` (B, T) to every layer of `cache` as
        keys and values: k = rope(k_norm(k_proj(g))), v = v_proj(g), each layer its own."""
        cos, sin = self.rotary_emb(g, position_ids)
        for index, layer in enumerate(self.layers):
            attn = layer.self_attn
            shape = (*g.shape[:-1], -1, attn.head_dim)
            keys = attn.k_norm(attn.k_proj(g).view(shape)).transpose(1, 2)  # (B, kv_heads, T, D)
            values = attn.v_proj(g).view(shape).transpose(1, 2)
            keys, _ = self._rope(keys, keys, cos, sin)  # cost: rotates the keys twice (one tensor)
            cache.update(keys, values, index)

    def block(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """Block tokens (B, S) at `position_ids` (B, S), attending over `cache` (the context, and
        its keys grow by these S) with `attention_mask` (B, 1, S, P + S) -> normed states (B, S, H)."""
        x = self.bound("embed")(input_ids)
        x = x.to(self.fc.weight.dtype)
        cos_sin = self.rotary_emb(x, position_ids)
        call = {self._cache_keyword: cache}
        for layer in self.layers:
            out = layer(x, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                        position_embeddings=cos_sin, **call)  # fmt: skip
            x = out[0] if isinstance(out, tuple) else out
        return self.norm(x)

    def draft_states(self, g: torch.Tensor, context_ids: torch.Tensor, visible: torch.Tensor,
                     anchors: torch.Tensor, anchor_tokens: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Training's parallel form: blocks at `anchors` (B, N) holding `anchor_tokens` (B, N)
        over the context g (B, T, H) at positions `context_ids` (B, T), of which `visible`
        (B, T) are real. Block j sees the real context positions < anchors[j] and itself.
        Returns the normed states (B, N, block_size, H). cost: N * block_size queries over
        T + N * block_size keys per row, every layer."""
        batch, count = anchors.shape
        size = self.block_size
        cache = self.new_cache()
        self.add_context(g, context_ids, cache)
        offsets = torch.arange(size, device=g.device)
        positions = (anchors[..., None] + offsets).reshape(batch, count * size)  # (B, N * S)
        tokens = torch.full((batch, count, size), self.mask_token_id, dtype=torch.long, device=g.device)
        tokens[..., 0] = anchor_tokens
        own = torch.arange(count, device=g.device).repeat_interleave(size)  # block of each query
        sees_context = (context_ids[:, None, :] < anchors.repeat_interleave(size, 1)[:, :, None]) & visible[
            :, None
        ]
        sees_block = (own[:, None] == own[None, :]).expand(batch, -1, -1)
        allowed = torch.cat([sees_context, sees_block], dim=-1)  # (B, N * S, T + N * S)
        mask = torch.zeros(allowed.shape, dtype=g.dtype, device=g.device)
        mask = mask.masked_fill(~allowed, torch.finfo(g.dtype).min)[:, None]
        states = self.block(tokens.reshape(batch, count * size), positions, mask, cache)
        return states.view(batch, count, size, -1)

    def draft_block(self, root: torch.Tensor, root_pos: torch.Tensor, prefix: torch.Tensor, cache: Any,
                    size: int | None = None) -> torch.Tensor:  # fmt: skip
        """Inference: one block [root, mask...] (B, size) at root_pos.. over the cached context
        (`prefix` (B, P): which cache entries are real) -> normed states (B, size, H). The block's
        own keys stay in `cache`: the caller truncates it."""
        size = self.block_size if size is None else size
        batch = root.shape[0]
        tokens = torch.full((batch, size), self.mask_token_id, dtype=torch.long, device=root.device)
        tokens[:, 0] = root
        positions = root_pos[:, None] + torch.arange(size, device=root.device)
        block = torch.ones(batch, size, size, dtype=torch.bool, device=root.device)
        mask = tree_attention_mask(prefix, block, self.fc.weight.dtype)  # (B, 1, S, P + S)
        return self.block(tokens, positions, mask, cache)

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """Normed states (..., H) -> logits over the draft vocabulary (..., Vd), through the
        target's lm_head (its Vd rows with a draft vocabulary; `draft_to_target` maps ids)."""
        lm_head = self.bound("lm_head")
        if not self.has_draft_vocab:
            return lm_head(states)
        return nn.functional.linear(states, self._draft_rows(lm_head))

    def draft_rows(self) -> torch.Tensor:
        """The target lm_head's draft-vocabulary rows (Vd, H), what `logits` multiplies by (a
        compiled round takes them as an input: the cache below is Python)."""
        return self._draft_rows(self.bound("lm_head"))

    def _draft_rows(self, lm_head: nn.Module) -> torch.Tensor:
        """The target lm_head's draft-vocabulary rows (Vd, H), cached until a weight changes."""
        weight = lm_head.weight
        key = (weight.data_ptr(), weight._version, self.d2t._version)  # type: ignore[union-attr]
        if self._rows is None or self._rows[0] != key:
            with torch.no_grad():
                self._rows = (key, weight[self.draft_ids().to(weight.device)])
        return self._rows[1]
