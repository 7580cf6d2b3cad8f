"""`headstart generate`: replies to prompts, streamed to stdout as tokens are accepted, then stats.

With `--heads` the speculative decoder runs (output identical to the target's for greedy and exact
sampling); without heads, or with `--no-heads`, plain decoding. Several `--prompt`s decode as one
batch (left padding).
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from headstart.commands.common import (
    add_sampling_arguments,
    add_target_arguments,
    check_generation_args,
    load_target_from_args,
    sampling_from_args,
)
from headstart.errors import HeadstartError

log = logging.getLogger(__name__)


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """Heads, tree and stop options shared by `generate` and `chat`."""
    group = parser.add_argument_group("speculative decoding")
    group.add_argument(
        "--heads",
        default=None,
        help="trained heads: a directory from `headstart train` or a Hub id (default: the heads shipped "
        "for the embedded smollm2 target, plain decoding for other targets)",
    )
    group.add_argument("--no-heads", action="store_true", help="plain decoding with the target alone")
    group.add_argument(
        "--draft-model",
        dest="draft",
        default=None,
        help="draft with a separate model in place of heads: anything --target takes (a smaller model "
        "with the target's tokenizer), or early-exit:K (the target's own first K layers, no training); "
        "tree: --tree, else what `headstart tune --draft-model` stored here, else chain:4; or "
        "lookahead[:window=W,ngram=N,guesses=G] (Lookahead decoding: "
        "Jacobi iterations and an n-gram pool, no model, its own tree)",
    )
    group.add_argument(
        "--draft-larger-ok",
        action="store_true",
        help="try a --draft-model that is not smaller than the target",
    )
    group.add_argument(
        "--speculate",
        choices=("auto", "always"),
        default="auto",
        help="auto: on a machine the heads' tree was not tuned on, measure once (~20 s, cached) whether "
        "they beat plain decoding here, and decode plainly if not (default); always: use the heads "
        "whatever they cost here. An explicit --tree is always used",
    )
    group.add_argument(
        "--tree",
        default=None,
        help="the tree stored with the heads by `headstart tune` if any, else static (default); or "
        "chain:N, JSON index paths, a .json file, dynamic, dynamic:depth=4,top_k=4,total_tokens=12 (EAGLE-2); "
        "any of them +lookup:K adds a prompt-lookup branch of K tokens (e.g. chain:1+lookup:4)",
    )
    group.add_argument(
        "--typical",
        action="store_true",
        help="LOSSY: Medusa typical acceptance when sampling (output is NOT the target's distribution)",
    )
    group.add_argument(
        "--compile",
        choices=("off", "on", "auto"),
        default="auto",
        help="run each verify (and plain step) as one compiled graph over a fixed KV buffer, a CUDA "
        "graph on a GPU; the first step of each tree size compiles (seconds). auto: on CUDA only "
        "(default; the CPU's eager path is faster)",
    )
    group.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    group.add_argument(
        "--truncate-prompt",
        action="store_true",
        help="keep the prompt's last tokens when prompt + --max-new-tokens exceeds the context (default: error)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument(
        "--prompt",
        action="append",
        required=True,
        help="the user message (or raw text with --raw); repeat to batch",
    )
    parser.add_argument("--raw", action="store_true", help="feed the prompt as plain text, no chat template")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per prompt instead of streaming"
    )
    add_sampling_arguments(parser)
    add_decoding_arguments(parser)


def check_utf8(text: str, what: str) -> str:
    """Text that came from the command line or a stream decoded with surrogateescape holds lone
    surrogates where its bytes were not UTF-8: refuse it by name (the tokenizer's own error is a
    TypeError traceback)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        bad = text[err.start : err.end].encode("utf-8", "surrogateescape")
        raise HeadstartError(
            f"{what} is not valid UTF-8 (byte {bad[:1].hex(' ')} at character {err.start})",
            "pass UTF-8 text (check the terminal's or the file's encoding, e.g. iconv -t UTF-8)",
        ) from None
    return text


def prompt_ids(target: Any, prompt: str, raw: bool, what: str = "--prompt") -> list[int]:
    check_utf8(prompt, what)
    if not prompt.strip():
        raise HeadstartError("the prompt is empty", 'pass some text, e.g. --prompt "Hello"')
    return target.chat.encode_raw(prompt) if raw else target.chat.user_prompt_ids(prompt)


def decoding_from_args(args: argparse.Namespace, target: Any) -> Any:
    """The Decoding (headstart/decoding.py) the flags of `generate`, `chat` and `serve` ask for."""
    from headstart.decoding import DecodeOptions, Decoding

    options = DecodeOptions(
        heads=args.heads, tree=args.tree, plain=args.no_heads, typical=args.typical,
        compile=getattr(args, "compile", "off"), calibrate=getattr(args, "speculate", "auto") == "auto",
        draft=getattr(args, "draft", None), draft_larger_ok=getattr(args, "draft_larger_ok", False),
        stops=tuple(getattr(args, "stop", ()) or ()), truncate_prompt=getattr(args, "truncate_prompt", False),
    )  # fmt: skip
    return Decoding(target, sampling_from_args(args), options)


def stats_line(stats: dict[str, Any], mode: str) -> str:
    return (
        f"[{stats['new_tokens']} new tokens, tau {stats['tau']} (tokens per target forward, bonus included), "
        f"{stats['tokens_per_s']} tokens/s, {stats['target_forwards']} target forwards; {mode}]"
    )


def run(args: argparse.Namespace) -> int:
    from transformers import TextStreamer

    check_generation_args(args)
    names = [
        "--prompt" if len(args.prompt) == 1 else f"--prompt #{k}" for k in range(1, len(args.prompt) + 1)
    ]
    for name, text in zip(names, args.prompt, strict=True):
        check_utf8(text, name)  # before the load
    target = load_target_from_args(args)
    decoding = decoding_from_args(args, target)
    batch = [prompt_ids(target, text, args.raw, name) for name, text in zip(names, args.prompt, strict=True)]
    stream = not args.json and len(batch) == 1
    streamer = TextStreamer(target.tokenizer, skip_prompt=True, skip_special_tokens=True) if stream else None
    results = decoding.run(batch, streamer=streamer)
    for token_ids, stats in results:
        text = target.tokenizer.decode(token_ids, skip_special_tokens=True)
        if args.json:
            print(json.dumps({"text": text, "token_ids": token_ids, "stats": stats}))
        elif not stream:
            print(text)
    if not args.json:
        for number, (_, stats) in enumerate(results, 1):
            label = f"prompt {number}: " if len(results) > 1 else ""
            log.info(("\n" if number == 1 else "") + label + stats_line(stats, decoding.mode))
    return 0
