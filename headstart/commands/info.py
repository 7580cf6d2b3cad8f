"""`headstart info`: what the target is, how long it took to load, and its forward latency."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from headstart.commands.common import add_target_arguments, load_target_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--context", type=int, default=128, help="KV context for the latency measurement")


def cpu_kernel_status(target: Any) -> str:
    """Which CPU matmul path headstart's decoders take for this target: the small-row kernel's
    library, MKL packs only, off (HEADSTART_PACKED=0 / HEADSTART_SMALLMM=0) or n/a (not fp32 CPU)."""
    from headstart.targets.mkl import mkl_packing_available
    from headstart.targets.packing import PackedLinears
    from headstart.targets.smallmm import small_matmul

    if PackedLinears.for_model(target.model) is None:
        return "off" if os.environ.get("HEADSTART_PACKED", "1") == "0" else "n/a"
    kernel = small_matmul()
    if kernel is not None:
        from torch import nn

        from headstart.targets.blocks import BF16
        from headstart.targets.gguf_blocks import blocks_for

        linears = [m for m in target.model.modules() if isinstance(m, nn.Linear)]
        found = [b for b in map(blocks_for, linears) if b is not None]
        rows = sum(b.kind == BF16 for b in found)
        kinds = " and ".join(
            f"{what} for {count} of {len(linears)} linears"
            for what, count in (("GGUF blocks", len(found) - rows), ("bf16 rows", rows))
            if count
        )
        blocks = f"; {kinds}, read up to {kernel.block_rows} rows" if found else ""
        return f"small-row kernel up to {kernel.max_rows} rows ({kernel.path}){blocks}"
    return "MKL packed weights" if mkl_packing_available() else "n/a"


def attention_summary(model: Any) -> str:
    """e.g. '15 sliding_attention (window 512) + 3 full_attention; tree-verifiable'."""
    from collections import Counter

    from headstart.targets.layer_kinds import layer_kinds

    kinds = layer_kinds(model)
    parts = [
        f"{n} {kind}" + (f" (window {kinds.window})" if kind == "sliding_attention" else "")
        for kind, n in Counter(kinds.kinds).items()
    ]
    verdict = (
        f"not tree-verifiable ({', '.join(kinds.unsupported)}): --no-heads"
        if kinds.unsupported
        else "tree-verifiable"
    )
    return f"{' + '.join(parts)}; {verdict}"


def check_context(context: int, target: Any = None) -> None:
    """--context must be >= 1 and leave room for the measured tokens in the target's context
    (checked before the load for the sign, after it for the length: a 100k-token prefill on a
    CPU runs for many minutes before failing)."""
    from headstart.errors import HeadstartError
    from headstart.targets.latency import REPEATS

    if context < 1:
        raise HeadstartError(f"--context must be >= 1, got {context}", "use e.g. --context 128")
    limit = getattr(target.config, "max_position_embeddings", None) if target is not None else None
    if limit and context + REPEATS > limit:
        raise HeadstartError(
            f"--context {context} + {REPEATS} measured tokens exceeds the target's context of {limit}",
            f"use --context {limit - REPEATS} or less",
        )


def run(args: argparse.Namespace) -> int:
    from headstart.targets.latency import single_token_latency_ms

    check_context(args.context)
    target = load_target_from_args(args)
    check_context(args.context, target)
    fp = target.fingerprint
    kernel = cpu_kernel_status(target)
    info = {
        "target": target.spec,
        "architecture": fp["architecture"],
        "model_type": fp["model_type"],
        "layers": target.num_layers,
        "attention": attention_summary(target.model),
        "hidden_size": target.hidden_size,
        "vocab_size": target.vocab_size,
        "parameters": sum(p.numel() for p in target.model.parameters()),
        "dtype": str(target.dtype).removeprefix("torch."),
        "device": str(target.device),
        "chat_template": target.chat.has_template,
        "eos_token_ids": list(target.eos_token_ids),
        "load_s": round(target.load_s, 3),
        # as transformers' generate runs it, then as headstart's decoders do (CPU kernels)
        "single_token_forward_ms": round(single_token_latency_ms(target, context=args.context), 2),
        "cpu_kernel": kernel,
    }
    if kernel not in ("off", "n/a"):
        info["single_token_forward_ms_kernel"] = round(
            single_token_latency_ms(target, context=args.context, kernels=True), 2
        )
    info["sha256"] = fp.get("sha256")
    if args.json:
        print(json.dumps(info))
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        if key == "parameters":
            value = f"{value:,} ({value / 1e6:.1f} M)"
        print(f"{key:<{width}}  {value}")
    return 0
