"""`headstart chat`: interactive multi-turn chat with the target's chat template.

Reads one user message per line from stdin (so it can be scripted: `printf 'hi\\n/exit\\n' |
headstart chat`), streams each reply as tokens are accepted, and prints stats to stderr.
Commands: `/reset` forgets the conversation, `/exit` (or end of input) quits.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from headstart.commands.common import (
    add_sampling_arguments,
    add_target_arguments,
    check_generation_args,
    load_target_from_args,
)
from headstart.commands.generate import add_decoding_arguments, check_utf8, decoding_from_args, stats_line
from headstart.errors import HeadstartError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument("--system", default=None, help="an optional system message")
    add_sampling_arguments(parser)
    add_decoding_arguments(parser)


def run(args: argparse.Namespace) -> int:
    check_generation_args(args)
    target = load_target_from_args(args)
    if not target.chat.has_template:
        raise HeadstartError(
            "this target's tokenizer has no chat template",
            "pass --chat-template FILE (a Jinja chat template), or use `headstart generate --raw`",
        )
    decoding = decoding_from_args(args, target)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    interactive = sys.stdin.isatty()
    if hasattr(sys.stdin, "reconfigure"):  # bytes that are not UTF-8 reach check_utf8, not a traceback
        sys.stdin.reconfigure(errors="surrogateescape")
    if interactive:  # line editing, history, and lines past the tty's 4,095-byte canonical buffer
        import readline  # noqa: F401 - input() uses it once imported
    print(f"chatting with {target.spec} ({decoding.mode}); /reset clears, /exit (or Ctrl-D) quits, Ctrl-C "
          "stops a reply", file=sys.stderr)  # fmt: skip
    while True:
        try:
            line = read_line(interactive)
        except KeyboardInterrupt:  # at the prompt: a fresh prompt, as a shell gives
            print(file=sys.stderr)
            continue
        if line is None or line.strip() == "/exit":
            return 0
        text = line.strip()
        if not text:
            continue
        if text == "/reset":
            messages = list(system)
            print("[conversation cleared]", file=sys.stderr)
            continue
        try:
            reply, stats = turn(target, decoding, messages, text)
        except HeadstartError as err:  # this message only: the conversation so far is kept
            hint = "; /reset starts a new one" if len(messages) > len(system) else ""
            print(f"{err.one_line()} (message dropped; the conversation goes on{hint})", file=sys.stderr)
            continue
        except KeyboardInterrupt:  # Ctrl-C in a reply stops that reply, not the conversation
            sys.stdout.flush()
            print("\n[reply stopped; message dropped, the conversation goes on]", file=sys.stderr)
            continue
        messages += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        sys.stdout.flush()
        print(stats_line(stats, decoding.mode), file=sys.stderr)


def read_line(interactive: bool) -> str | None:
    """The next line, None at the end of input (Ctrl-D)."""
    if not interactive:
        return sys.stdin.readline() or None
    try:
        if sys.stdout.isatty():
            return input("> ")
        print("> ", end="", file=sys.stderr, flush=True)  # replies alone on a redirected stdout
        return input()
    except EOFError:
        print(file=sys.stderr)  # the shell's prompt on a line of its own
        return None


def turn(target: Any, decoding: Any, messages: list[dict[str, str]], text: str) -> tuple[str, dict]:
    """One user message answered after `messages` (left unchanged): (reply text, stats)."""
    from transformers import TextStreamer

    check_utf8(text, "the message")
    ids = target.chat.prompt_ids([*messages, {"role": "user", "content": text}])
    streamer = TextStreamer(target.tokenizer, skip_prompt=True, skip_special_tokens=True)
    [(token_ids, stats)] = decoding.run([ids], streamer=streamer)
    return target.tokenizer.decode(token_ids, skip_special_tokens=True), stats
