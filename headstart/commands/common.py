"""Arguments shared by subcommands (target selection, sampling) and the quiet-loading context."""

from __future__ import annotations

import argparse
from typing import Any

from headstart.config import check_threads
from headstart.logs import quiet_transformers


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("target")
    group.add_argument(
        "--target",
        default="smollm2",
        help="Hub id, local model directory, .gguf file, or 'smollm2' (embedded default)",
    )
    group.add_argument(
        "--dtype",
        default="auto",
        choices=["float32", "bfloat16", "float16", "auto"],
        help="auto: bfloat16 on CUDA, float32 on CPU",
    )
    group.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (CUDA when present)")
    group.add_argument("--revision", default=None, help="Hub revision (branch, tag or commit)")
    group.add_argument(
        "--chat-template",
        default=None,
        help="a chat template file (or the Jinja text) for targets whose tokenizer has none",
    )
    group.add_argument(
        "--threads",
        type=int,
        default=0,
        help="CPU threads for torch (0 = torch's default; 1 is often fastest on a CPU shared with other jobs)",
    )


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument("--max-new-tokens", type=int, default=128)
    group.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    group.add_argument("--top-p", type=float, default=1.0)
    group.add_argument("--top-k", type=int, default=0, help="0 = no limit")
    group.add_argument("--seed", type=int, default=None)


def check_generation_args(args: argparse.Namespace) -> None:
    """Refuse bad sampling/stop/heads arguments, and flags that would be silently ignored, before
    any model loads (a first GGUF load takes ~30 s)."""
    from headstart.errors import HeadstartError

    sampling = sampling_from_args(args)
    if any(stop == "" for stop in getattr(args, "stop", None) or []):
        raise HeadstartError("--stop '' would stop after the first token", "pass a non-empty stop string")
    heads = getattr(args, "heads", None)
    if heads is not None and not heads.strip():
        raise HeadstartError("--heads is empty", "pass a heads directory or Hub id, or --no-heads")
    draft = getattr(args, "draft", None)
    if draft is not None and heads is not None:
        raise HeadstartError("--draft-model drafts in place of heads: --heads would be ignored",
                             "pass --heads or --draft-model, not both")  # fmt: skip
    if getattr(args, "no_heads", False):
        given = [flag for flag, value in (("--heads", heads), ("--draft-model", draft), ("--tree", getattr(args, "tree", None)),
                                          ("--typical", getattr(args, "typical", False))) if value]  # fmt: skip
        if given:
            raise HeadstartError(f"--no-heads decodes without drafts: {', '.join(given)} would be ignored",
                                 f"drop {' or '.join(given)}, or --no-heads")  # fmt: skip
    tree = getattr(args, "tree", None)
    if tree:  # its syntax before the target loads (the heads' depth is checked once they load)
        from headstart.inference.trees.lookup import split_lookup
        from headstart.inference.trees.spec import parse_tree

        base, _ = split_lookup(tree)
        if base:
            parse_tree(base)
    if getattr(args, "typical", False) and sampling.greedy:
        raise HeadstartError(
            "--typical only changes sampling; at --temperature 0 decoding is greedy and exact",
            "add --temperature 0.7 (for example), or drop --typical",
        )
    check_target_args(args)


def check_target_args(args: argparse.Namespace) -> None:
    """--target and --revision before the load: an empty target, a revision for a local model."""
    from headstart.errors import HeadstartError

    target = getattr(args, "target", None)
    if target is not None and not str(target).strip():
        raise HeadstartError("--target is empty", "pass a Hub id, a model directory, a .gguf file or smollm2")
    if getattr(args, "revision", None) and target is not None:
        from pathlib import Path

        if target == "smollm2" or str(target).endswith(".gguf") or Path(target).expanduser().exists():
            raise HeadstartError(
                f"--revision {args.revision} only applies to Hub ids; --target {target} is a local model",
                "drop --revision",
            )


def sampling_from_args(args: argparse.Namespace) -> Any:
    from headstart.inference.plain import SamplingConfig

    return SamplingConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
    )


def load_target_from_args(args: argparse.Namespace) -> Any:
    from headstart.targets import load_target

    threads = getattr(args, "threads", 0) or 0
    check_threads(threads)
    check_target_args(args)
    if threads:
        import torch

        torch.set_num_threads(threads)
    with quiet_transformers():
        return load_target(args.target, dtype=args.dtype, device=args.device, revision=args.revision,
                           chat_template=getattr(args, "chat_template", None))  # fmt: skip
