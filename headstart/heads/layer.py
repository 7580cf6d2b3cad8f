"""One decoder layer of the target's own architecture, for EAGLE-style heads.

No modeling code is copied: the layer and rotary-embedding classes are taken from a 1-layer copy
of the target's transformers config, instantiated on the meta device (no memory, no weights), so
Llama, Qwen2, Mistral, Gemma, ... all work without a line of per-architecture code.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from headstart.errors import HeadstartError
from headstart.targets.features import cache_keyword, decoder_layers, tree_attention_mask


def one_layer_config(target_config: dict[str, Any], layers: int = 1) -> Any:
    """The target's transformers config reduced to one full-attention decoder layer (`layers`
    of them: a multi-layer EAGLE-3 head), with sdpa attention (sdpa passes our 4D float masks
    through unchanged)."""
    from transformers import AutoConfig

    data = dict(target_config)
    model_type = data.pop("model_type", None)
    if not model_type:
        raise HeadstartError("head config has no target model_type", "re-create the head from its target")
    for key in ("architectures", "transformers_version", "_name_or_path", "auto_map"):
        data.pop(key, None)
    data["num_hidden_layers"] = layers
    # The draft layer attends over its own short context with FULL attention, whatever the
    # target's layers do (sliding, mixed): its context is the draft's, and the 4D masks it gets
    # already say what each node sees. transformers' caches and attention read `layer_types`.
    data["layer_types"] = ["full_attention"] * layers
    config = AutoConfig.for_model(model_type, **data)
    config._attn_implementation = "sdpa" if _supports_sdpa(config) else "eager"
    return config


def _supports_sdpa(config: Any) -> bool:
    """Whether the architecture runs on sdpa (gemma2 and gpt_oss do not: soft-capping, sinks);
    eager attention takes the same 4D float masks, only slower."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    try:
        return bool(getattr(MODEL_MAPPING[type(config)], "_supports_sdpa", False))
    except KeyError:
        return True


def layer_classes(config: Any) -> tuple[type[nn.Module], type[nn.Module], type[nn.Module]]:
    """(decoder layer, rotary embedding, final norm) classes of the architecture, found structurally."""
    from transformers import AutoModel

    with torch.device("meta"):
        base = AutoModel.from_config(config)
    rotary = getattr(base, "rotary_emb", None)
    if rotary is None:
        raise HeadstartError(
            f"{type(base).__name__} has no rotary_emb: cannot build an EAGLE head for it",
            "use a RoPE decoder target (Llama, Qwen2, Mistral, Gemma, ...)",
        )
    norm = getattr(base, "norm", None)
    if not isinstance(norm, nn.Module):
        raise HeadstartError(f"{type(base).__name__} has no final .norm", "use a Llama-style decoder target")
    return type(decoder_layers(base)[0]), type(rotary), type(norm)


def _init_custom_parameters(layer: nn.Module, config: Any) -> None:
    """Initialise what only the architecture's `_init_weights` initialises: parameters held
    directly by transformers' own modules (fused MoE experts, attention sinks) are created with
    torch.empty and left as garbage outside `from_pretrained`/`from_config`. torch's own modules
    (Linear, Embedding) keep their constructors' init."""
    from transformers import AutoModel

    with torch.device("meta"):
        base = AutoModel.from_config(config)  # only for its _init_weights (no memory)
    for module in layer.modules():
        if type(module).__module__.startswith("torch.") or not any(
            True for _ in module.parameters(recurse=False)
        ):
            continue
        with torch.no_grad():
            base._init_weights(module)


# What the reference EAGLE-3 layer calls on the target's decoder layer (Llama-style pre-norm).
EAGLE3_PARTS = ("input_layernorm", "post_attention_layernorm", "mlp", "self_attn")
EAGLE3_PROJECTIONS = ("q_proj", "k_proj", "v_proj")


class DraftLayer(nn.Module):
    """The head's decoder layer (`layers` of them: the first, then plain ones over its output)
    plus its rotary embedding, callable with a KV cache.

    With `eagle3_input` the layer is EAGLE-3's reference first layer (the EAGLE release, vLLM,
    SGLang, speculators): q/k/v read 2H = cat(input_layernorm(embed), hidden_norm(g)) and the
    attention's residual is g itself. Built by swapping the target layer's q/k/v projections for
    2H-input ones and adding `hidden_norm`, so its state dict is the reference's `layers.0.*`.
    """

    def __init__(self, target_config: dict[str, Any], eagle3_input: bool = False, layers: int = 1) -> None:
        super().__init__()
        self.config = one_layer_config(target_config, layers)
        layer_cls, rotary_cls, self.norm_cls = layer_classes(self.config)
        self.layer = layer_cls(self.config, layer_idx=0)
        # the layers after the first (a multi-layer EAGLE-3 head): plain decoder layers of the
        # same class over the first one's output, each with its own cache entries (layer_idx)
        self.more = nn.ModuleList(layer_cls(self.config, layer_idx=i) for i in range(1, layers))
        for module in (self.layer, *self.more):
            _init_custom_parameters(module, self.config)
        self.rotary_emb = rotary_cls(config=self.config)
        # per-kind rotary settings (Gemma 3: local/global): the draft layer is a full-attention one
        takes_kind = "layer_type" in inspect.signature(self.rotary_emb.forward).parameters
        self._rotary_kind = {"layer_type": "full_attention"} if takes_kind else {}
        self.eagle3_input = eagle3_input
        if eagle3_input:
            self._widen_attention_inputs()

    def _widen_attention_inputs(self) -> None:
        layer = self.layer
        attn = getattr(layer, "self_attn", None)
        missing = [n for n in EAGLE3_PARTS if not hasattr(layer, n)]
        missing += [
            f"self_attn.{n}" for n in EAGLE3_PROJECTIONS if not isinstance(getattr(attn, n, None), nn.Linear)
        ]
        if missing:
            raise HeadstartError(
                f"{type(layer).__name__} lacks {', '.join(missing)}: the reference EAGLE-3 layer needs a "
                "Llama-style pre-norm decoder layer",
                "use head.layout=fc for this target",
            )
        for name in EAGLE3_PROJECTIONS:
            old = getattr(attn, name)
            wide = nn.Linear(2 * old.in_features, old.out_features, bias=old.bias is not None)
            setattr(attn, name, wide.to(old.weight.dtype))
        layer.hidden_norm = self.new_norm()

    def new_norm(self) -> nn.Module:
        """A final norm of the architecture's class (EAGLE-3's own norm before its lm_head)."""
        eps = getattr(self.config, "rms_norm_eps", 1e-6)
        return self.norm_cls(self.config.hidden_size, eps=eps)

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    def forward(
        self,
        hidden: torch.Tensor,
        *,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        embeds: torch.Tensor | None = None,
        keys_only: bool = False,
    ) -> torch.Tensor | None:
        """hidden (B, T, H) -> (B, T, H); an `eagle3_input` layer also takes the token embeddings
        `embeds` (B, T, H). Without a mask, attention is causal over the cache and the new tokens;
        right padding is harmless because no real token attends forward.

        `keys_only`: only add the positions' keys and values to `past_key_values` and return None,
        for positions whose output nobody reads (training's prompt tokens). cost: the attention
        still runs (its queries are thrown away) but the MLP does not; a layer that is not
        Llama-style pre-norm (`EAGLE3_PARTS`) runs whole."""
        batch, steps, _ = hidden.shape
        if attention_mask is None:
            cached = past_key_values.get_seq_length() if past_key_values is not None else 0
            prefix = torch.ones(batch, cached, dtype=torch.bool, device=hidden.device)
            causal = torch.ones(steps, steps, dtype=torch.bool, device=hidden.device).tril()
            attention_mask = tree_attention_mask(prefix, causal, hidden.dtype)  # (B, 1, T, cached + T)
        cos_sin = self.rotary_emb(hidden, position_ids, **self._rotary_kind)
        call = dict(
            attention_mask=attention_mask,
            position_ids=position_ids,
            **{cache_keyword(type(self.layer).forward): past_key_values},
            use_cache=past_key_values is not None,
            position_embeddings=cos_sin,
        )
        first_keys_only = keys_only and not self.more  # later layers need the first one's output
        if self.eagle3_input:
            if embeds is None:
                raise HeadstartError("the EAGLE-3 layer needs the token embeddings", "pass embeds=")
            out = self._eagle3_forward(hidden, embeds, call, first_keys_only)
        else:
            out = _run_layer(self.layer, hidden, call, first_keys_only)
        for i, layer in enumerate(self.more):
            out = _run_layer(layer, out, call, keys_only and i == len(self.more) - 1)
        return out

    def _eagle3_forward(
        self, hidden: torch.Tensor, embeds: torch.Tensor, call: dict[str, Any], keys_only: bool
    ) -> torch.Tensor | None:
        """The reference order (norm_before_residual=False): the residual is g before hidden_norm."""
        layer = self.layer
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)  # (B, T, 2H)
        attn = layer.self_attn(hidden_states=x, **call)
        if keys_only:
            return None
        h = hidden + (attn[0] if isinstance(attn, tuple) else attn)
        mlp = layer.mlp(layer.post_attention_layernorm(h))
        return h + (mlp[0] if isinstance(mlp, tuple) else mlp)  # MoE blocks may add router scores


def _run_layer(
    layer: nn.Module, hidden: torch.Tensor, call: dict[str, Any], keys_only: bool
) -> torch.Tensor | None:
    """One decoder layer over hidden (B, T, H); `keys_only`: only its attention's keys and values
    are cached (a Llama-style pre-norm layer skips its MLP; another runs whole), None returned."""
    if keys_only and all(hasattr(layer, n) for n in EAGLE3_PARTS):
        layer.self_attn(hidden_states=layer.input_layernorm(hidden), **call)
        return None
    out = layer(hidden, **call)
    return None if keys_only else out[0] if isinstance(out, tuple) else out


@torch.no_grad()
def copy_alike(layer: nn.Module, donor: nn.Module) -> list[str]:
    """Copy into `layer` every parameter of the target layer `donor` whose name and shape agree and
    whose module computes alike with the same weights (linear maps always; norms only where the
    families' norms agree: Gemma's 1 + w RMSNorm does not); return the names left as they were."""
    theirs, left = dict(donor.named_parameters()), []
    for name, param in layer.named_parameters():
        if (
            name in theirs
            and theirs[name].shape == param.shape
            and _alike(layer, donor, name.rsplit(".", 1)[0])
        ):
            param.copy_(theirs[name].to(param.dtype))
        else:
            left.append(name)
    return left


def _alike(layer: nn.Module, donor: nn.Module, name: str) -> bool:
    """Whether the submodule `name` of the draft layer computes what the donor's does with the
    same weights (norms differ across families; linear maps do not)."""
    mine, theirs = layer.get_submodule(name), donor.get_submodule(name)
    if isinstance(mine, nn.Linear):
        return isinstance(theirs, nn.Linear)
    return same_norm(theirs, mine)


@torch.no_grad()
def same_norm(theirs: nn.Module, mine: nn.Module) -> bool:
    """Two norm modules agree on a probe once given the same weight (cost: two tiny forwards)."""
    import copy

    weight = getattr(theirs, "weight", None)
    if weight is None or getattr(mine, "weight", None) is None or weight.shape != mine.weight.shape:
        return False
    probe_mod = copy.deepcopy(mine).float()
    probe_mod.weight.copy_(weight.float())
    probe = torch.randn(2, weight.shape[-1], generator=torch.Generator().manual_seed(0))
    ours = probe_mod(probe.to(probe_mod.weight.device))
    ref = copy.deepcopy(theirs).float()(probe.to(weight.device))
    return bool(torch.allclose(ours.cpu(), ref.cpu(), atol=1e-5, rtol=1e-4))
