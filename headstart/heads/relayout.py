"""A warm start for reference-layout EAGLE-3 heads from trained fc-layout ones (`init_from` an fc
head in a recipe whose head.layout is reference). Not an exact conversion, which does not exist:
the fc layer's residual is x = A norm_e(e) + B norm_g(g) + b (its fc over the normed embedding
and fused feature g), the reference's is its own fused feature alone. What carries over exactly:
the draft vocabulary (d2t, t2d), norm, lm_head, o_proj, the MLP and its norm. The rest maps the
fc layer's inputs into the reference's:

    g_ref = B diag(w_g) F / r                       (F = the three layers; the fc head's g = F)
    q/k/v_ref = s W diag(w_in) [A | rho I]          (input_layernorm_ref = norm_e, hidden_norm_ref = 1)

so g_ref is the feature part of x (B norm_g(g), at its mean size), and q/k/v read what the fc
layer's input_layernorm gave them, up to each token's scale around the means r = rms(g),
rho = rms(B norm_g(g)) and s = 1 / rms(x); the embedding part A norm_e(e) and b are missing from
the residual, which training restores. `calibrate` measures r, rho, s on real conversations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headstart.errors import HeadstartError
from headstart.heads.layer import EAGLE3_PROJECTIONS

# Tensors the two layouts share name for name (the reference's decoder layer minus q/k/v).
SHARED = ("lm_head.weight", "norm.weight", "d2t", "t2d")


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.sqrt(x.float().pow(2).mean(-1) + eps)  # (..., ) per token


@dataclass(frozen=True)
class Scales:
    s: float
    """mean 1 / rms(x) over the sample."""
    r: float
    """mean rms(g)."""
    rho: float
    """mean rms(B norm_g(g))."""


@torch.no_grad()
def calibrate(fc_head: nn.Module, fused: torch.Tensor, embeds: torch.Tensor) -> Scales:
    """The module docstring's means from real tokens: the fc head's fused features g (N, H) and
    the embeddings e (N, H) of the tokens that follow them."""
    _check_input_norms(fc_head)
    eps = float(getattr(fc_head.midlayer.layer.input_layernorm, "variance_epsilon", 1e-6))
    normed_g = fc_head.hidden_norm(fused)
    x = fc_head.fc(torch.cat([fc_head.embed_norm(embeds), normed_g], dim=-1))
    feature_part = normed_g @ _halves(fc_head)[1].T
    mean = lambda t: float(_rms(t, eps).mean())  # noqa: E731
    return Scales(s=float((1 / _rms(x, eps)).mean()), r=mean(fused), rho=mean(feature_part))


def _halves(fc_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """A, B: the fc layer's (H, H) blocks over the normed embedding and the normed feature."""
    weight = fc_head.fc.weight
    hidden = weight.shape[0]
    return weight[:, :hidden], weight[:, hidden:]


def _check_input_norms(fc_head: nn.Module) -> None:
    if getattr(fc_head, "embed_norm", None) is None or fc_head.hidden_norm is None:
        raise HeadstartError(
            "the fc-layout head has no input norms (saved before input_norms): no warm start for it",
            "train the reference-layout head from scratch (drop init_from)",
        )


@torch.no_grad()
def reference_from_fc(fc_head: nn.Module, ref_head: nn.Module, scales: Scales) -> nn.Module:
    """Fill `ref_head` (Eagle3Head, same target and draft vocabulary size) from `fc_head`
    (Eagle3FcHead with input norms); returns ref_head."""
    _check_input_norms(fc_head)
    src, dst = fc_head.state_dict(), ref_head.state_dict()
    for name in SHARED:
        dst[name].copy_(src[name])
    a, b = _halves(fc_head)
    dst["fc.weight"].copy_(b @ (fc_head.hidden_norm.weight[:, None] * src["fuse_fc.weight"]) / scales.r)
    src_layer = fc_head.midlayer.layer.state_dict()
    ln = src_layer["input_layernorm.weight"][None, :]  # (1, H): diag(w_in) from the right
    for key, value in ref_head.midlayer.layer.state_dict().items():
        proj = key.split(".")[1] if key.startswith("self_attn.") else None
        if proj in EAGLE3_PROJECTIONS and key.endswith("weight"):
            w = scales.s * src_layer[key] * ln  # (out, H)
            value.copy_(torch.cat([w @ a, scales.rho * w], dim=1))  # (out, 2H)
        elif key == "input_layernorm.weight":
            value.copy_(fc_head.embed_norm.weight)
        elif key == "hidden_norm.weight":
            value.fill_(1.0)
        else:  # o_proj, MLP, post-attention norm (and any q/k norms) mean the same in both
            value.copy_(src_layer[key])
    return ref_head


def sample_for_calibration(
    head: nn.Module, target: Any, conversations: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(fused g_t, embed(x_{t+1})) over the given conversations' tokens, from the target itself.
    Cost: one target forward per conversation."""
    from headstart.targets.features import capture

    fused, embeds = [], []
    embed = target.model.get_input_embeddings()
    # the fc head stays where it was loaded (CPU); the target may be on CUDA
    here = next(head.parameters()).device
    for ids in conversations:
        ids = ids.to(target.device)
        feats = capture(target.model, ids[None], layers=head.feature_layers, logits_to_keep=1)
        layers = {i: x.to(here) for i, x in feats.layers.items()}
        g = head.fuse(feats.last_hidden.to(here), layers)[0, :-1]  # (T-1, H)
        fused.append(g.float())
        embeds.append(embed(ids[1:]).float().to(here))
    return torch.cat(fused), torch.cat(embeds)
