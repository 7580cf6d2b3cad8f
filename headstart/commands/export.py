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
                        "SpecForge, EAGLE repo, llama.cpp's converter), medusa (vLLM), dflash (z-lab), headstart (own, e.g. in bf16) "
                        "or transformers (a trained draft_model as a plain model directory, for --draft-model)")  # fmt: skip
    parser.add_argument(
        "--output",
        required=True,
        help="directory to write: new, empty, or an earlier export in the same --format (replaced "
        "atomically); anything else needs --overwrite",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a non-empty --output that is not an earlier export of this format: only the files "
        "export writes are replaced, every other file stays",
    )
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument(
        "--target",
        default=None,
        help="the target the heads were trained for (checked; default: the one their config records, else smollm2)",
    )
    parser.add_argument(
        "--kind",
        default=None,
        help="which shipped heads, by kind (default: the first shipped kind the --format takes); not with a "
        "heads directory",
    )
    parser.add_argument(
        "--verifier",
        default=None,
        help="the target's name for the serving engine (default: its Hub id; smollm2 -> HuggingFaceTB/SmolLM2-135M-Instruct)",
    )


def run(args: argparse.Namespace) -> int:
    from headstart.commands.common import quiet_transformers
    from headstart.heads import load_heads
    from headstart.heads.defaults import recorded_target, shipped_for_format
    from headstart.heads.formats import export_heads, is_export
    from headstart.heads.resolve import resolve_heads
    from headstart.outputs import check_output
    from headstart.targets import load_target
    from headstart.tuned import stored_tune

    if args.heads is not None and not args.heads.strip():
        raise HeadstartError("the heads directory is empty ('')", "pass a heads directory, or leave it out")
    if args.heads and args.kind:
        raise HeadstartError(
            f"--kind picks among the shipped heads; the heads {args.heads} are exported as they are",
            "drop --kind",
        )
    if args.heads:
        path = resolve_heads(args.heads, flag="heads directory")
    else:
        path = shipped_for_format(args.target or "smollm2", args.format, args.kind)
    target_spec = args.target or recorded_target(path)
    # before anything loads: an output that would destroy files or cannot be written is refused
    output = check_output(
        args.output,
        "--output",
        owned=lambda folder: is_export(folder, args.format),
        command=f"`headstart export --format {args.format}`",
        overwrite=args.overwrite,
        # the target too: --output holding its local directory (or .gguf) would delete it
        inputs=[path, *([target_spec] if target_spec and Path(target_spec).expanduser().exists() else [])],
    )
    with quiet_transformers():
        target = load_target(target_spec)
    heads = load_heads(path, target)  # checked against the target before anything is written
    out = export_heads(heads, args.format, output, dtype=args.dtype, verifier=args.verifier,
                       tuned=stored_tune(path), tokenizer=target.tokenizer)  # fmt: skip
    print(f"exported {heads.kind} heads from {path} as {args.format} ({args.dtype}) -> {out}")
    return 0
