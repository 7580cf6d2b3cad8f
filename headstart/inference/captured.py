"""Decoding steps as compiled graphs over fixed-size KV buffers (`--compile`): the verify
(`CapturedVerify`), described here, and the pieces every head kind's compiled steps share (their
classes live with their drafters: inference/drafters/<kind>.py, `Drafter.compiled_steps`), which
follow the same pattern over the head's own cache.

Eager, every decode step is the target's Python forward: hundreds of kernel launches, which on
a GPU cost more than a small model's arithmetic (on an H100 a SmolLM2 step was launch-bound for
`generate`, EAGLE-3 and Medusa alike). Here the verify (and a plain step, the root-only tree) is
`torch.compile(fullgraph=True)` of the same model call, with shapes that never change between
steps, so it compiles once per node bucket and, with mode "reduce-overhead" on CUDA, replays as
a CUDA graph:

* the cache: each attention layer's keys/values live in ONE preallocated (B, kv_heads, C, D)
  buffer that this object owns and reuses across calls (C: the capacity, rounded up to
  `CAPACITY_STEP` so prompts of different lengths share a graph). The growing cache of
  targets/growing_cache.py already keeps every layer's entries as a prefix view of such a
  buffer; eager prefill, commit (an index copy) and rollback (a shorter view) work unchanged;
* the step writes its N new entries at columns [P, P + N) of the buffers (`index_copy_` at a
  position held in a device tensor, not a Python int) and attends over all C columns; a 4D mask
  hides the columns past P + N and every entry a row does not see;
* the tree is padded to a bucket of N nodes (1, 2, 4, ... 128): pad nodes see only themselves,
  no real node sees them, and their outputs are dropped;
* the caller's feature layers are taken by forward hooks registered once per model and kept
  (see `_taps`).

No host sync is added: P and the tree size are known on the host. When the cache is not a
prefix of this object's buffer (rows left or joined the batch: the engine made fresh tensors),
or the tree would pass the capacity, `verify` returns None and the caller runs the eager
forward, which moves the cache into a fresh buffer.

Costs: attention reads all C columns every step (C - P of them masked): small beside the
weights for a short context on a GPU, but a CPU pays it and loses headstart's packed matmuls,
which is why the CPU default stays eager (measured: EAGLE-3 on SmolLM2 38.8 tok/s eager, 20.4
captured, the same tokens; README). The first step of each shape compiles (seconds to a
minute); on CUDA the outputs the decoder keeps are copied out of the graph's memory.

With greedy decoding and a drafter that has round parts, the whole round (draft, this verify,
acceptance, the commit) runs as ONE program over these buffers instead: inference/captured_round.py.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from headstart.targets import Features
from headstart.targets.layer_kinds import decoder_layers

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
CAPACITY_STEP = 512
MODES = ("off", "on", "auto")


def wants_capture(choice: str, device: torch.device) -> bool:
    """`--compile off|on|auto`: auto captures on CUDA only (the CPU's eager path is faster:
    packed small-row kernels, no padded attention)."""
    if choice not in MODES:
        from headstart.errors import HeadstartError

        raise HeadstartError(
            f"--compile must be one of {', '.join(MODES)}, got {choice!r}", "use --compile auto"
        )
    return choice == "on" or (choice == "auto" and device.type == "cuda")


class StaticKV:
    """What the model sees as its cache inside the graph: `update` writes the new entries at
    columns start + arange(m) of the fixed buffers and returns the whole buffers."""

    is_compileable = True

    def __init__(
        self, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], start: torch.Tensor
    ) -> None:
        self.keys, self.values, self.start = keys, values, start

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        columns = self.start + torch.arange(key_states.shape[-2], device=key_states.device)
        self.keys[layer_idx].index_copy_(2, columns, key_states.to(self.keys[layer_idx].dtype))
        self.values[layer_idx].index_copy_(2, columns, value_states.to(self.values[layer_idx].dtype))
        return self.keys[layer_idx], self.values[layer_idx]


class BufferPool:
    """The fixed KV buffers a compiled step writes into, kept across calls (static addresses)."""

    def __init__(self) -> None:
        self.pool: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None

    def adopt(self, cache: Any) -> None:
        """Make an empty growing cache start in this pool's buffers (when they fit), with its
        reserve rounded up to `CAPACITY_STEP` and new buffers zeroed."""
        layers = getattr(cache, "layers", [])
        if not layers or not all(hasattr(layer, "pool") for layer in layers):
            return
        for i, layer in enumerate(layers):
            layer.reserve = CapturedVerify.capacity_for(layer.reserve)
            layer.zeroed = True  # unused columns are read (masked): no uninitialised NaNs
            if self.pool is not None and i < len(self.pool[0]):
                layer.pool = (self.pool[0][i], self.pool[1][i])

    def claim(self, cache: Any, length: int, count: int,
              pad: bool = True) -> tuple[int, list[torch.Tensor], list[torch.Tensor]] | None:  # fmt: skip
        """Room for `count` new entries after `length` cached ones: (their padded count, the
        buffers), or None when the step must run eagerly (no bucket fits, the cache is not a
        prefix of the buffers, or the padded entries would pass their end). `pad=False`: a fixed
        count (a DFlash block), not a bucket."""
        size = count if not pad else next((b for b in BUCKETS if b >= count), None)
        buffers = self.take(cache, length) if size is not None else None
        if size is None or buffers is None or length + size > buffers[0][0].shape[-2]:
            return None
        return size, buffers[0], buffers[1]

    def take(self, cache: Any, length: int) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
        """Every layer's (keys, values) buffers when each layer's view is their first `length`
        columns; None otherwise (the caller goes eager)."""
        keys, values = [], []
        for layer in getattr(cache, "layers", []):
            kb, vb = getattr(layer, "_key_buffer", None), getattr(layer, "_value_buffer", None)
            ends = layer.ends() if hasattr(layer, "ends") else None
            if ends is not None and kb is not None and vb is not None:  # views a round left unsliced
                if ends != length:
                    return None
                keys.append(kb)
                values.append(vb)
                continue
            k = getattr(layer, "keys", None)
            if kb is None or vb is None or k is None or k.dim() != 4 or k.shape[-2] != length:
                return None
            if k.data_ptr() != kb.data_ptr() or layer.values.data_ptr() != vb.data_ptr():
                return None
            keys.append(kb)
            values.append(vb)
        if not keys:
            return None
        if self.pool is None or any(a is not b for a, b in zip(self.pool[0], keys, strict=False)):
            self.pool = (keys, values)  # the next prefill reuses them (static addresses)
            if keys[0].device.type == "cuda":
                for tensor in keys + values:
                    torch._dynamo.mark_static_address(tensor)
        return keys, values


class CapturedVerify:
    """One target's compiled verify; buffers and graphs are kept for the decoder's lifetime."""

    def __init__(self, model: torch.nn.Module, feature_layers: Sequence[int], backend: str = "inductor",
                 mode: str | None = None) -> None:  # fmt: skip
        self.model = model
        self.feature_layers = tuple(dict.fromkeys(int(i) for i in feature_layers))
        self.taps = _taps(model)
        from headstart.targets.features import cache_keyword

        self.cache_kw = cache_keyword(type(model).forward)  # outside the graph (an lru_cache)
        mode = graph_mode(model, mode)
        self.fn = _compiled(backend, mode)
        self.buffers = BufferPool()
        self.steps = 0  # verifies that ran captured
        self.fallbacks = 0  # verifies handed back to the eager path

    # ---- the cache ----------------------------------------------------------------------------
    @staticmethod
    def capacity_for(entries: int) -> int:
        return -(-entries // CAPACITY_STEP) * CAPACITY_STEP

    def adopt(self, cache: Any) -> None:
        """Give the (empty, growing) cache this object's buffers for the next prefill."""
        self.buffers.adopt(cache)

    @property
    def pool(self) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
        return self.buffers.pool

    # ---- the step -----------------------------------------------------------------------------
    def verify(self, cache: Any, visible: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
               tree_visible: torch.Tensor, dtype: torch.dtype) -> Features | None:  # fmt: skip
        """The verify of `tokens` (B, n) at `positions` (B, n); `visible` (B, P) the cached
        columns each row sees, `tree_visible` (n, n) or (B, n, n). None: run it eagerly."""
        batch, n = tokens.shape
        length = visible.shape[1]
        claimed = self.buffers.claim(cache, length, n)
        if claimed is None:
            self.fallbacks += 1
            return None
        size, keys, values = claimed
        device = tokens.device
        tokens, positions = pad_nodes(tokens, size), pad_nodes(positions, size)
        tree = tree_visible.expand(batch, n, n) if tree_visible.dim() == 2 else tree_visible
        allowed = torch.cat([visible[:, None, :].expand(batch, n, length), tree], dim=-1)
        mask = static_mask(allowed, size, keys[0].shape[-2], dtype)
        start = column(length, device)
        from headstart.targets.attention import grouped_query_attention

        with grouped_query_attention(self.model) if device.type == "cpu" else contextlib.nullcontext():
            step_begins(device)
            logits, last, layers = own(self.fn(self.model, self.taps, self.feature_layers, self.cache_kw, tokens,
                                                positions, mask, start, keys, values))  # fmt: skip
        end_views(cache, length + n)
        self.steps += 1
        return Features(logits=logits[:, :n], last_hidden=last[:, :n],
                        layers={i: x[:, :n] for i, x in layers.items()})  # fmt: skip


def step_begins(device: torch.device) -> None:
    """CUDA graphs (reduce-overhead) reuse their output memory at the next replay: tell them a
    new step begins, so outputs still alive from the last one are not an error."""
    if device.type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()


def own(outputs: Any) -> Any:
    """Outputs the caller may keep past the next graph replay: on CUDA a copy (a CUDA graph's
    outputs live in its static memory; cost: logits-sized copies per step), elsewhere as they are."""

    def copy(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.clone() if x.device.type == "cuda" else x
        if isinstance(x, dict):
            return {k: copy(v) for k, v in x.items()}
        if isinstance(x, (tuple, list)):
            return type(x)(copy(v) for v in x)
        return x

    return copy(outputs)


_COLUMNS: dict[str, torch.Tensor] = {}


def column(index: int, device: torch.device) -> torch.Tensor:
    """`index` as a 0-d device tensor without a host-to-device copy per step (on CUDA a copy
    from pageable memory would wait for the stream: a sync): a view into an arange kept per
    device, grown when needed."""
    key = str(device)
    table = _COLUMNS.get(key)
    if table is None or table.numel() <= index:
        table = torch.arange(max(2 * index + 1, 8192), device=device)
        _COLUMNS[key] = table
    return table[index]


def graph_mode(module: torch.nn.Module, mode: str | None) -> str | None:
    """torch.compile's mode: "reduce-overhead" (CUDA graphs: one replay per step instead of the
    launches) for a module on CUDA, unless the caller chose one."""
    if mode is None and next(module.parameters()).device.type == "cuda":
        return "reduce-overhead"
    return mode


def pad_nodes(x: torch.Tensor, size: int) -> torch.Tensor:
    """(B, n) -> (B, size), padded with the last column (tokens, positions of pad nodes)."""
    pad = size - x.shape[1]
    return torch.cat([x, x[:, -1:].expand(-1, pad)], 1) if pad else x.contiguous()  # strides are guarded


def static_mask(allowed: torch.Tensor, size: int, capacity: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, size, capacity) additive mask: the n real nodes see what `allowed` (B, n, length + n)
    says, pad node i sees only its own column length + n + i, no node sees the columns after."""
    batch, n, width = allowed.shape
    sees = torch.zeros(batch, size, capacity, dtype=torch.bool, device=allowed.device)
    sees[:, :n, :width] = allowed
    if size > n:
        sees[:, n:, width : width + size - n] = torch.eye(size - n, dtype=torch.bool, device=allowed.device)
    mask = torch.zeros(sees.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~sees, torch.finfo(dtype).min)[:, None]


def end_views(cache: Any, length: int) -> None:
    """Every layer's views end after the real entries (the pad nodes' entries stay unseen):
    sliced when next read, where the layer can wait (targets/growing_cache.py, `end_at`)."""
    for layer in cache.layers:
        if hasattr(layer, "end_at"):
            layer.end_at(length)
        else:
            layer.keys = layer._key_buffer[:, :, :length]
            layer.values = layer._value_buffer[:, :, :length]


def allow_graphs() -> None:
    """One graph per shape is the design (node buckets x levels x batch sizes): dynamo's default
    of 8 graphs per function would refuse the 9th under fullgraph. cost: more compiles if a
    caller's shapes keep changing (the batch is fixed in the cases this serves)."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, 64)


def _graph(model: torch.nn.Module, taps: dict[int, torch.Tensor], layer_ids: tuple[int, ...], cache_kw: str,
           tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, start: torch.Tensor,
           keys: list[torch.Tensor], values: list[torch.Tensor]) -> Any:  # fmt: skip
    """The verify forward that is compiled: every input explicit, nothing kept on an object."""
    from headstart.targets.layer_kinds import layer_masks

    out = model(input_ids=tokens, attention_mask=layer_masks(model, mask), position_ids=positions,
                **{cache_kw: StaticKV(keys, values, start)}, use_cache=True)  # fmt: skip
    return out.logits, taps[-1], {i: taps[i] for i in layer_ids}


@functools.cache
def _compiled(backend: str, mode: str | None) -> Any:
    """One compiled `_graph` per backend and mode, shared by every decoder (dynamo keys its
    graphs on the model, the shapes and the layer ids)."""
    allow_graphs()
    return torch.compile(_graph, fullgraph=True, backend=backend, mode=mode, dynamic=False)


_TAPS: weakref.WeakKeyDictionary[torch.nn.Module, dict[int, torch.Tensor]] = weakref.WeakKeyDictionary()


def _taps(model: torch.nn.Module) -> dict[int, torch.Tensor]:
    """Forward hooks on every decoder layer (its output under the layer's index) and on the
    lm_head (its input under -1), registered ONCE per model and never removed: dynamo guards a
    module's hooks by their number only, so hooks that come and go with each decoder would
    leave a graph that traced another object's hook (wrong features, measured). Cost: a dict
    store per layer per forward, for every forward of this model."""
    if model in _TAPS:
        return _TAPS[model]
    taps: dict[int, torch.Tensor] = {}

    def keep_output(layer_id: int) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            taps[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    def keep_lm_input(_module: Any, args: Any) -> None:
        taps[-1] = args[0]

    for i, block in enumerate(decoder_layers(model)):
        block.register_forward_hook(keep_output(i))
    model.get_output_embeddings().register_forward_pre_hook(keep_lm_input)
    _TAPS[model] = taps
    return taps
