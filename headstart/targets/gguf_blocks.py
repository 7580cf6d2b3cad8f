"""A GGUF target's linear weights kept in the file's quantised blocks, for the CPU decode kernel.

Why: a GGUF target (the embedded SmolLM2 is Q4_1, its lm_head Q8_0) is loaded as fp32, its
blocks dequantised, so a decode step streams 4 bytes per weight (538 MB for SmolLM2). The blocks
hold the same weights in 0.75 (Q4_1) or 1.125 (Q8_0) bytes. `smallmm.c`'s block entry point
dequantises them on the fly into the very fp32 weights the model holds and runs the same
multiply-add chain, so its outputs equal the fp32 kernel's bit for bit: decoding is faster and
nothing else changes (greedy output stays `generate`'s).

What it keeps, per `nn.Linear` whose GGUF tensor is Q4_1 or Q8_0: the blocks repacked as
smallmm.c reads them (nibbles or int8 rows, fp32 scales and mins), in the module's row order
(llama's q/k rows are permuted between GGUF and transformers: found by matching rows). A module
is attached only when its blocks dequantise to exactly its weight; anything else (another quant
type, a mismatch, a weight changed in place since) keeps the fp32 path. Cost: about 0.8 bytes per
weight of extra memory (~100 MB for SmolLM2) and ~1 s at load. `HEADSTART_GGUF_BLOCKS=0` turns it off.

The same path reads bf16 rows (`attach_bf16`) of any fp32 weight whose values are all exactly
bf16: draft heads (shipped and exported in bf16, decoded in fp32) and checkpoints stored in bf16.
Widening bf16 to fp32 is exact, so again the bits are the fp32 kernel's, reading half the bytes.

The blocks assume a frozen target, as headstart keeps it. A weight changed by an ordinary tensor op
(its `_version` moves) or replaced falls back to fp32 by itself; one changed behind autograd's back
(`weight.data.mul_(...)`, `.data = ...`) cannot be seen: call `detach(model)` after such a change.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from headstart.targets.blocks import BF16, Q4_1, Q8_0, BlockWeight, dequantise

log = logging.getLogger(__name__)

MAX_INNER = 65536  # 4 rows of this many fp32 weights: 1 MiB of each thread's stack
_BLOCKS: weakref.WeakKeyDictionary[nn.Linear, BlockWeight] = weakref.WeakKeyDictionary()
_attached = [0]  # bumped by every attach: forwards bound before it may not read the new blocks


def generation() -> int:
    """Changes whenever blocks are attached (packing.py keys its bound forwards on it)."""
    return _attached[0]


def blocks_for(module: nn.Linear) -> BlockWeight | None:
    """The module's blocks when they still equal its weight, else None."""
    found = _BLOCKS.get(module)
    weight = module.weight
    if found is None or weight._version != found.version or weight.data_ptr() != found.pointer:
        return None
    return found


def detach(model: nn.Module) -> None:
    """Drop every block kept for `model`'s linears: decoding reads the fp32 weights again."""
    for module in model.modules():
        _BLOCKS.pop(module, None)
    _attached[0] += 1


def usable() -> bool:
    """Whether decoding can read blocks here: not switched off, and the small-row kernel built and
    reads them for at least one row count (else keeping them would only cost memory)."""
    if os.environ.get("HEADSTART_GGUF_BLOCKS", "1") == "0":
        return False
    from headstart.targets.smallmm import small_matmul

    kernel = small_matmul()
    return kernel is not None and kernel.block_rows > 0


def attach(model: nn.Module, gguf_path: Path, cache_dir: Path | None = None) -> int:
    """Keep the blocks of every linear of `model` (fp32, CPU) whose GGUF tensor is Q4_1 or Q8_0
    and dequantises to exactly its weight; returns how many were attached. With `cache_dir` (the
    converted model's directory), the repacked blocks are kept there in CACHE_FILE: reading the
    GGUF's metadata alone takes ~3.5 s (its tokenizer arrays), the kept file well under one."""
    linears = {
        name: m for name, m in model.named_modules() if isinstance(m, nn.Linear) and _fp32_cpu(m.weight)
    }
    if not linears or not usable():  # a GPU or bf16 target: its kernels read the weights as they are
        return 0
    kept = cache_dir / CACHE_FILE if cache_dir is not None else None
    found = _read_kept(kept, linears) if kept is not None and kept.is_file() else None
    if found is None:
        found = _from_gguf(model, linears, gguf_path)
        if kept is not None:
            _write_kept(kept, found)
    _attached[0] += 1
    for name, blocks in found.items():
        module = linears[name]
        _BLOCKS[module] = BlockWeight(blocks.kind, blocks.qs, blocks.d, blocks.m, module.weight._version,
                                      module.weight.data_ptr())  # fmt: skip
    log.info(
        "GGUF blocks kept for %d of %d linears (%.0f MB; decode reads them instead of fp32): %s",
        len(found), len(linears), sum(b.nbytes for b in found.values()) / 2**20, Path(gguf_path).name,
    )  # fmt: skip
    return len(found)


def attach_bf16(model: nn.Module) -> int:
    """Keep bf16 rows of every fp32 CPU linear of `model` whose weight is exactly bf16 (see the
    module doc) and that the kernel reads; returns how many. Called where decoding starts
    (`PackedLinears.for_model`), so training never holds them. No file: one conversion, at the
    first decode. Cost: 2 bytes per such weight of extra memory, held while the module lives (a
    weight whose first row is not bf16 is turned down at once; linears sharing a weight share
    the rows). `HEADSTART_BF16_ROWS=0` (or `HEADSTART_GGUF_BLOCKS=0`) turns it off. A model may
    name linears it never calls as modules (`linears_not_called()`, e.g. projections it reads
    row subsets of): they get none."""
    if os.environ.get("HEADSTART_BF16_ROWS", "1") == "0":
        return 0
    skipped = {id(m) for m in getattr(model, "linears_not_called", tuple)()}
    linears = [
        m for m in model.modules()
        if isinstance(m, nn.Linear) and id(m) not in skipped and m not in _BLOCKS
        and "forward" not in m.__dict__  # a patched forward (packing.py leaves those alone)
        and _fp32_cpu(m.weight) and m.weight.is_contiguous() and m.in_features <= MAX_INNER
        and _bf16_values(m.weight[:1])  # one row turns down an fp32-trained weight at once
    ]  # fmt: skip
    if not linears or not usable():  # a GPU, bf16 or fp32-valued model: nothing to read instead
        return 0
    shared: dict[tuple[int, int], BlockWeight] = {}  # (pointer, version) -> rows: a tied weight once
    for module in linears:
        weight = module.weight.detach()
        pointer, version = weight.data_ptr(), module.weight._version
        if (pointer, version) not in shared:
            if not _bf16_values(weight):  # not bf16 values: fp32 stays
                continue
            bits = (weight.view(torch.int32) >> 16).to(torch.int16)  # the high halves: exact
            shared[pointer, version] = BlockWeight(BF16, bits, weight.new_empty(0), None, version, pointer)
        _BLOCKS[module] = shared[pointer, version]
    count = sum(m in _BLOCKS for m in linears)
    if count:
        _attached[0] += 1
    return count


def _bf16_values(weight: torch.Tensor) -> bool:
    """Every value's low 16 bits are zero: a bit test (a float compare would pass a subnormal
    under flush-to-zero that bf16 cannot hold)."""
    return not bool((weight.detach().contiguous().view(torch.int32) & 0xFFFF).any())


CACHE_FILE = "gguf_blocks.safetensors"


def _from_gguf(model: nn.Module, linears: dict[str, nn.Linear], gguf_path: Path) -> dict[str, BlockWeight]:
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    field = reader.fields.get("general.architecture")
    arch_name = bytes(field.parts[field.data[0]]).decode() if field is not None else ""
    arch = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}.get(arch_name)
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if arch is None or not layers:
        return {}
    names = gguf.get_tensor_name_map(arch, layers)
    tensors = {t.name: t for t in reader.tensors}
    embeddings = getattr(model.get_input_embeddings(), "weight", None)
    found = {}
    for qualified, module in linears.items():
        name = names.get_name(f"{qualified}.weight", try_suffixes=(".weight",))
        tensor = tensors.get(name or "")
        if tensor is None and module.weight is embeddings:
            tensor = tensors.get("token_embd.weight")  # a tied lm_head: the GGUF keeps only the embeddings
        blocks = _blocks(tensor, module.weight, gguf) if tensor is not None else None
        if blocks is not None:
            found[qualified] = blocks
    return found


FORMAT = "1"  # the kept file's layout; another (or none) is read again from the GGUF


def _read_kept(path: Path, linears: dict[str, nn.Linear]) -> dict[str, BlockWeight] | None:
    """The kept blocks, or None when the file is damaged, of another format or does not fit the
    model. Written after the blocks were checked against these weights (the converted directory of
    the same GGUF); each tensor's first row is checked again here (~a millisecond in all)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                return None
            found = {}
            for name, kind in json.loads(meta.get("kinds", "{}")).items():
                module = linears.get(name)
                if module is None or kind not in (Q4_1, Q8_0):
                    return None
                qs, d = f.get_tensor(f"{name}.qs"), f.get_tensor(f"{name}.d")
                m = f.get_tensor(f"{name}.m") if kind == Q4_1 else None
                if not _fits(kind, qs, d, m, module.weight):
                    return None
                found[name] = BlockWeight(kind, qs, d, m, 0, 0)
            return found
    except Exception as err:  # noqa: BLE001 - safetensors' own error type is not an OSError
        log.warning("warning: ignoring the kept GGUF blocks %s (%s): reading the GGUF again", path, err)
        return None


def _fits(kind: int, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, weight: torch.Tensor) -> bool:
    """Blocks of the layout smallmm.c reads, for this weight's shape, whose first row dequantises
    to the weight's first row."""
    rows, inner = weight.shape
    scales = (rows, inner // 32)
    if kind == Q4_1:
        shapes = qs.dtype == torch.uint8 and qs.shape == (rows, inner // 2) and m is not None
        shapes = shapes and m.dtype == torch.float32 and m.shape == scales
    else:
        shapes = qs.dtype == torch.int8 and qs.shape == (rows, inner)
    if not (shapes and d.dtype == torch.float32 and d.shape == scales and inner % 32 == 0):
        return False
    first = dequantise(kind, qs[:1], d[:1], None if m is None else m[:1])
    return torch.equal(first[0], weight[0].detach())


def _write_kept(path: Path, found: dict[str, BlockWeight]) -> None:
    """Write atomically; a directory we may not write (a shared cache) just keeps nothing."""
    from safetensors.torch import save_file

    tensors = {}
    for name, blocks in found.items():
        tensors[f"{name}.qs"], tensors[f"{name}.d"] = blocks.qs, blocks.d
        if blocks.m is not None:
            tensors[f"{name}.m"] = blocks.m
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    kinds = json.dumps({n: b.kind for n, b in found.items()})
    try:
        save_file(tensors, str(tmp), metadata={"format": FORMAT, "kinds": kinds})
        os.replace(tmp, path)
    except Exception as err:  # noqa: BLE001 - safetensors' I/O errors are not OSErrors
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        log.debug("GGUF blocks not kept in %s: %s", path.parent, err)


def _fp32_cpu(weight: torch.Tensor) -> bool:
    return weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.dim() == 2


def _blocks(tensor: Any, weight: torch.Tensor, gguf: Any) -> BlockWeight | None:
    """`tensor`'s blocks repacked in `weight`'s row order, or None when they are of another type
    or do not dequantise to exactly `weight`."""
    rows, inner = weight.shape
    kind = {gguf.GGMLQuantizationType.Q4_1: Q4_1, gguf.GGMLQuantizationType.Q8_0: Q8_0}.get(
        tensor.tensor_type
    )
    if kind is None or inner % 32 or tuple(int(n) for n in tensor.shape) != (inner, rows):
        return None
    if inner > MAX_INNER:  # smallmm.c dequantises 4 rows of it onto each thread's stack
        return None
    qs, d, m, dense = repack(np.asarray(tensor.data), kind, rows, inner)
    order = _row_order(dense, weight.detach())
    if order is None:
        return None
    if order is not ...:
        qs, d = qs[order].contiguous(), d[order].contiguous()
        m = m[order].contiguous() if m is not None else None
    return BlockWeight(kind, qs, d, m, weight._version, weight.data_ptr())


def repack(raw: np.ndarray, kind: int, rows: int, inner: int) -> tuple[torch.Tensor, ...]:
    """A GGUF tensor's raw Q4_1 or Q8_0 blocks (rows x inner weights) as smallmm.c reads them:
    (qs, d, m or None), and the fp32 weight they dequantise to, computed as gguf-py does."""
    raw = raw.reshape(rows, inner // 32, -1)  # (N, K/32, block bytes)
    d = torch.from_numpy(raw[..., :2].copy().view(np.float16)[..., 0].astype(np.float32))
    if kind == Q4_1:
        m = torch.from_numpy(raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
        qs = torch.from_numpy(np.ascontiguousarray(raw[..., 4:]).reshape(rows, inner // 2))
    else:
        m = None
        qs = torch.from_numpy(np.ascontiguousarray(raw[..., 2:]).view(np.int8).reshape(rows, inner))
    return qs, d, m, dequantise(kind, qs, d, m)


def _row_order(dense: torch.Tensor, weight: torch.Tensor) -> Any:
    """`...` when `dense` equals `weight`; else the row index putting `dense`'s rows in `weight`'s
    order (transformers permutes llama's q/k rows out of GGUF's rope layout) when one does; None."""
    if torch.equal(dense, weight):
        return ...
    if dense.shape[0] > 16384:  # row matching is for the attention projections, not vocabularies
        return None
    where = {dense[i].numpy().tobytes(): i for i in range(dense.shape[0])}
    order = [where.get(weight[i].numpy().tobytes()) for i in range(weight.shape[0])]
    if any(i is None for i in order):
        return None
    index = torch.tensor(order)
    return index if torch.equal(dense[index], weight) else None
