"""torch.compile for the training step (`compile: true`): the frozen target's feature forward
(here) and `compiled`, which an objective wraps its own step in (EAGLE-3's training-time-test
unroll, forward and backward: headstart.train.objectives.eagle), each one graph with dynamic
shapes, so batches of any length run the same graphs after the first two (the first compiles, a
second of another length makes the shapes symbolic; then no recompile:
tests/train/test_train_compiled.py).

Why: eager, both are chains of small kernels (norms, rotary, SiLU, residual adds, masks) around
matmuls of hidden size 576, launch-bound on a GPU and memory-bound on a CPU; compiled, inductor
fuses them. Exploratory runs on the 2-core Xeon (bf16 autocast, batch 8 x ~200 tokens) gave the
target's forward 1.7-2.3x and the unroll with its backward 1.25x; no compiled profile is committed
yet (docs/results/scaling/smollm2-eagle3-train-profile-cpu.md says what is).
cost: the first batch compiles (~2.5 minutes each graph on that CPU; less on a GPU host's cores).
The step must be free of host syncs and data-dependent shapes for this: the batch's indices
come from its host-side plan (headstart.train.objectives.eagle.plan).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from headstart.targets.features import Features, decoder_layers


def _features(decoder: torch.nn.Module, input_ids: torch.Tensor, layers: tuple[int, ...]) -> Any:
    """The target's decoder output (the lm_head's input) and the outputs of `layers` (layer id
    i's output is hidden_states[i + 1], headstart.targets.features' convention)."""
    out = decoder(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    return out.last_hidden_state, [out.hidden_states[i + 1] for i in layers]


@functools.cache
def compiled(function: Any, backend: str) -> Any:
    """`function` as one torch.compile graph with dynamic shapes (one per function and backend;
    dynamo keys its guards on the modules passed in)."""
    return torch.compile(function, dynamic=True, backend=backend, fullgraph=True)


def compiled_features(model: Any, input_ids: torch.Tensor, layers: Sequence[int], backend: str) -> Features:
    """`capture(model, input_ids, layers=..., logits_to_keep=1)` without grad as one compiled
    graph: logits None (the losses project the positions they score)."""
    decoder = model.get_decoder()
    last = len(decoder_layers(model)) - 1
    if last in layers:
        from headstart.errors import HeadstartError

        # transformers' last hidden state is the final norm's output, not the last layer's
        raise HeadstartError(
            f"compile: true reads the target's layers from its hidden states, which lack the last layer's "
            f"output (layer {last}, tapped by this head)",
            "set compile=false, or tap earlier layers (head.feature_layers)",
        )
    if not getattr(decoder, "_headstart_warmed", False):
        # transformers installs its hidden-state hooks on the first call, under a lock dynamo
        # cannot trace: one tiny eager call first
        with torch.no_grad():
            _features(decoder, input_ids[:1, :2], ())
        decoder._headstart_warmed = True
    with torch.no_grad():
        last, taken = compiled(_features, backend)(decoder, input_ids, tuple(layers))
    return Features(logits=None, last_hidden=last, layers=dict(zip(layers, taken, strict=True)))
