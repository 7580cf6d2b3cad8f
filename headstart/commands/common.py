"""Arguments shared by subcommands (target selection, sampling) and the quiet-loading context."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from typing import Any


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
    """Refuse bad sampling/stop arguments before any model loads (a first GGUF load takes ~30 s)."""
    from headstart.errors import HeadstartError

    sampling_from_args(args)
    if any(stop == "" for stop in getattr(args, "stop", None) or []):
        raise HeadstartError("--stop '' would stop after the first token", "pass a non-empty stop string")


def sampling_from_args(args: argparse.Namespace) -> Any:
    from headstart.inference.plain import SamplingConfig

    return SamplingConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
    )


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' info logs and per-tensor progress bars while loading a target
    (left on with -v/--verbose)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if os.environ.get("HEADSTART_VERBOSE") == "1":
        yield
        return
    from transformers.utils import logging

    previous = logging.get_verbosity()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(previous)
        logging.enable_progress_bar()


def load_target_from_args(args: argparse.Namespace) -> Any:
    from headstart.target import load_target

    threads = getattr(args, "threads", 0) or 0
    if threads < 0:
        from headstart.errors import HeadstartError

        raise HeadstartError(
            f"--threads must be >= 0, got {threads}", "use --threads 1, or 0 for the default"
        )
    if threads:
        import torch

        torch.set_num_threads(threads)
    with quiet_transformers():
        return load_target(args.target, dtype=args.dtype, device=args.device, revision=args.revision,
                           chat_template=getattr(args, "chat_template", None))  # fmt: skip
