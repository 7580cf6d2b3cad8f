"""`headstart generate`: one reply to one prompt, streamed to stdout, then stats on stderr."""

from __future__ import annotations

import argparse
import json
import sys

from headstart.commands.common import (
    add_sampling_arguments,
    add_target_arguments,
    load_target_from_args,
    sampling_from_args,
)
from headstart.errors import HeadstartError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument("--prompt", required=True, help="the user message (or raw text with --raw)")
    parser.add_argument("--raw", action="store_true", help="feed the prompt as plain text, no chat template")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    add_sampling_arguments(parser)


def prompt_ids(target: object, prompt: str, raw: bool) -> list[int]:
    if not prompt.strip():
        raise HeadstartError("the prompt is empty", 'pass some text, e.g. --prompt "Hello"')
    return target.chat.encode_raw(prompt) if raw else target.chat.user_prompt_ids(prompt)  # type: ignore[attr-defined]


def run(args: argparse.Namespace) -> int:
    from transformers import TextStreamer

    from headstart.inference.plain import plain_generate

    sampling = sampling_from_args(args)
    target = load_target_from_args(args)
    ids = prompt_ids(target, args.prompt, args.raw)
    streamer = (
        None if args.json else TextStreamer(target.tokenizer, skip_prompt=True, skip_special_tokens=True)
    )
    result = plain_generate(target, ids, sampling, streamer=streamer)
    stats = {
        "new_tokens": result.new_tokens,
        "tau": None,  # plain decoding commits one token per target forward; no draft heads
        "tokens_per_s": round(result.tokens_per_s, 2),
        "target_forwards": result.target_forwards,
    }
    if args.json:
        text = target.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        print(json.dumps({"text": text, "token_ids": result.token_ids, "stats": stats}))
        return 0
    print(
        f"\n[{stats['new_tokens']} new tokens, {stats['tokens_per_s']} tokens/s, plain decoding]",
        file=sys.stderr,
    )
    return 0
