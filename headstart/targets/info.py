"""What `headstart info` reports of a loaded target (a module not named `describe`: importing it as
headstart.targets.describe replaced the package's `describe` function, the fingerprint's words, with
the module, and a later distill refusal raised TypeError): its shape, attention layers, the CPU
matmul path headstart's decoders take, and its single-token forward latency."""

from __future__ import annotations

import os
from typing import Any


def describe(target: Any, context: int) -> dict[str, Any]:
    """The target's report, its latency measured over a KV context of `context` tokens (as
    transformers' generate runs it, then as headstart's decoders do where CPU kernels apply)."""
    from headstart.targets.latency import single_token_latency_ms

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
        "single_token_forward_ms": round(single_token_latency_ms(target, context=context), 2),
        "cpu_kernel": kernel,
    }
    if kernel not in ("off", "n/a"):
        info["single_token_forward_ms_kernel"] = round(
            single_token_latency_ms(target, context=context, kernels=True), 2
        )
    info["sha256"] = fp.get("sha256")
    return info


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
