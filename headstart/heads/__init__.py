"""Draft heads (Medusa, EAGLE-1/2, EAGLE-3, DFlash; kinds registered in `kinds`) and their Hugging
Face checkpoints.

`build_head(spec, target)` makes a fresh head for a target; `load_heads(path, target)` loads a
saved one (any kind), refusing heads trained for another target. See `base` for the contract.
"""

from headstart.heads.base import DraftHead, EagleLike, MedusaLike
from headstart.heads.build import build_head, draft_vocab, head_config, load_heads, load_heads_for_inference
from headstart.heads.checkpoint import check_fits
from headstart.heads.config import HeadConfig, HeadSpec
from headstart.heads.eagle import Eagle3FcHead, Eagle3Head, EagleHead
from headstart.heads.medusa import MedusaHeads

__all__ = [
    "DraftHead",
    "Eagle3FcHead",
    "Eagle3Head",
    "EagleHead",
    "EagleLike",
    "HeadConfig",
    "HeadSpec",
    "MedusaHeads",
    "MedusaLike",
    "build_head",
    "check_fits",
    "draft_vocab",
    "head_config",
    "load_heads",
    "load_heads_for_inference",
]
