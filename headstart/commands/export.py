"""`headstart export`: write trained heads in a serving engine's format (vLLM, SGLang, llama.cpp)."""

from __future__ import annotations

import argparse
from pathlib import Path

from headstart.errors import HeadstartError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from headstart.heads.formats import FORMATS

    parser.add_argument(
        "heads",
        nargs="?",
        default=None,
        help="heads directory or Hub id (default: the heads shipped for --target, e.g. smollm2)",
    )
    parser.add_argument("--format", required=True, choices=FORMATS, help="speculators (vLLM), eagle (SGLang, "
                        "SpecForge, EAGLE repo, llama.cpp's converter), medusa (vLLM) or headstart (own, e.g. in bf16)")  # fmt: skip
    parser.add_argument("--output", required=True, help="directory to write (replaced atomically)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--target", default="smollm2", help="the target the heads were trained for (checked)")
    parser.add_argument(
        "--kind", default=None, choices=["eagle3", "medusa"], help="which shipped heads (default: by format)"
    )
    parser.add_argument(
        "--verifier",
        default=None,
        help="the target's name for the serving engine (default: its Hub id; smollm2 -> HuggingFaceTB/SmolLM2-135M-Instruct)",
    )


def run(args: argparse.Namespace) -> int:
    from headstart.commands.common import quiet_transformers
    from headstart.heads import load_heads
    from headstart.heads.defaults import shipped_heads
    from headstart.heads.formats import export_heads
    from headstart.heads.resolve import resolve_heads
    from headstart.io import check_writable
    from headstart.target import load_target

    output = check_writable(Path(args.output).parent, "--output") / Path(args.output).name  # before loading
    if args.heads:
        path = resolve_heads(args.heads)
    else:
        kind = args.kind or ("medusa" if args.format == "medusa" else "eagle3")
        shipped = shipped_heads(args.target)
        path = shipped.get(f"smollm2-{kind}")  # type: ignore[assignment]
        if path is None:
            raise HeadstartError(
                f"no shipped {kind} heads for target '{args.target}'", "pass a heads directory or Hub id"
            )
    with quiet_transformers():
        target = load_target(args.target)
    heads = load_heads(path, target)  # checked against the target before anything is written
    out = export_heads(heads, args.format, output, dtype=args.dtype, verifier=args.verifier)
    print(f"exported {heads.kind} heads from {path} as {args.format} ({args.dtype}) -> {out}")
    return 0
