"""`headstart <command> ...`: parse and dispatch only.

Each subcommand lives in a module with `add_arguments(parser)` and `run(args) -> int`; this file
only lists them. Modules import heavy libraries (torch, transformers) inside `run`, so `--help`
is instant. A `HeadstartError` prints one line (what is wrong, and the fix) and exits with status
2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from headstart import __version__
from headstart.errors import HeadstartError

COMMANDS = {
    "info": ("headstart.commands.info", "load a target and print its shape, load time and forward latency"),
    "generate": ("headstart.commands.generate", "generate a reply, streaming to stdout"),
    "chat": (
        "headstart.commands.chat",
        "chat with the target (multi-turn, chat template), speculative with --heads",
    ),
    "distill": (
        "headstart.commands.distill",
        "self-distillation: the target's own replies to prompts, as resumable shards",
    ),
    "tune": ("headstart.commands.tune", "pick the fastest draft tree for trained heads on this hardware"),
    "push": ("headstart.commands.push", "publish trained heads to the Hugging Face Hub"),
    "export": (
        "headstart.commands.export",
        "write heads in a serving engine's format (speculators/vLLM, EAGLE-3/SGLang/llama.cpp, Medusa)",
    ),
    "bench": ("headstart.commands.bench", "measure speed-up vs vanilla and PLD on a question set"),
    "serve": (
        "headstart.commands.serve",
        "an OpenAI-compatible server (chat and text completions, streaming), speculative and continuously batched",
    ),
    "train": (
        "headstart.commands.train",
        "train draft heads (Medusa-1/2, EAGLE-1, EAGLE-3) on a frozen target",
    ),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument as every other error is reported: one line on
    stderr naming the flag, with the fix, exit status 2 (not the usage block and a second line)."""

    def error(self, message: str) -> NoReturn:
        from headstart.errors import printable

        self.exit(2, printable(f"error: {self.prog}: {message} -- fix: see `{self.prog} --help`") + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="headstart",
        description="Lossless self-speculative decoding with trained draft heads (Medusa, EAGLE-1/2/3).",
    )
    parser.add_argument("--version", action="version", version=f"headstart {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    _add_verbosity(parser, default=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help="show full tracebacks"
        )
        _add_verbosity(command, default=argparse.SUPPRESS)
        importlib.import_module(module).add_arguments(command)
        command.set_defaults(_module=module)
    return parser


def _add_verbosity(parser: argparse.ArgumentParser, default: object) -> None:
    """-q/-v before or after the command name (the command's copy wins when both are given)."""
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default,
        help="warnings and errors only, no progress bars",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=default, help="debug lines and transformers' logs"
    )


def console() -> int:
    """The `headstart` executable (and `python -m headstart`): `main` on a machine other processes
    may share: before torch is imported, the thread count comes from the cores no other process
    keeps busy, and idle threads wait passively when some do (headstart.hardware.share_machine;
    HEADSTART_SHARE_MACHINE=0, OMP_NUM_THREADS or OMP_WAIT_POLICY keep torch's own choice). Only
    here, not in `main`: a process that imported torch already (tests, notebooks) keeps its own."""
    import os

    argv = sys.argv[1:]
    asks_help = not argv or any(a in ("-h", "--help", "--version") for a in argv)
    if os.environ.get("HEADSTART_SHARE_MACHINE", "1") != "0" and not asks_help and "torch" not in sys.modules:
        from headstart.hardware import share_machine

        share_machine(threads_given=any(a.split("=")[0] == "--threads" for a in argv))
    return main()


def main(argv: list[str] | None = None) -> int:
    """Run one command: its exit status, 2 with one line for an error the user can fix, 130 when
    interrupted (Ctrl-C at any moment, imports included), 141 when stdout's reader went away."""
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    _stack_dumps()
    try:
        return _main(argv)
    except HeadstartError as err:
        if debug:
            raise
        print(err.one_line(), file=sys.stderr)
        return err.status
    except KeyboardInterrupt as err:
        if debug:
            raise
        print(f"interrupted{_where(err)}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `headstart ... | head`: the reader is gone, as for any Unix tool
        _silence_stdout()
        return 141
    except OSError as err:  # stdout on a full disk, a vanished directory: the environment, not a bug
        if debug:
            raise
        from headstart.errors import printable

        where = err.filename or "the output (stdout)"
        _silence_stdout()
        print(printable(f"error: {err.strerror or err} ({where}) -- fix: check the disk, the paths and "
                        "their permissions"), file=sys.stderr)  # fmt: skip
        return 2


def _stack_dumps() -> None:
    """`kill -USR1 PID` prints every thread's Python stack to stderr and the command goes on: a
    run that seems stuck (even inside a C call, where SIGTERM's handler cannot run) shows where.
    Not on Windows (no SIGUSR1), nor when stderr has no file descriptor (pytest's capture)."""
    import faulthandler
    import signal

    if not hasattr(signal, "SIGUSR1"):
        return
    try:
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, OSError, RuntimeError):  # a stderr without fileno()
        pass


def _where(err: BaseException) -> str:
    """' in FUNC (FILE:LINE)' of the innermost frame the interrupt reached: a run cut by a timeout
    says where it was (loading, a step, an evaluation) without --debug."""
    import os
    import traceback

    frames = traceback.extract_tb(err.__traceback__)
    frames = [f for f in frames if not f.filename.endswith(f"headstart{os.sep}interrupts.py")]  # the handler
    if not frames:
        return ""
    last = frames[-1]
    where = f" in {last.name} ({last.filename}:{last.lineno})"
    ours = [f for f in frames if f"{os.sep}headstart{os.sep}" in f.filename]
    if ours and ours[-1] is not last:
        where += f", called from {ours[-1].name} ({ours[-1].filename}:{ours[-1].lineno})"
    return where


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's own flush at exit does not fail again."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _main(argv: list[str] | None) -> int:
    from headstart.logs import configure, verbosity

    parser = build_parser()
    # argparse stops filling a positional list at the first flag: `train --recipe R a=1 --resume
    # b=2` would refuse b=2. Dotted overrides after a flag join the command's own list.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not (isinstance(getattr(args, "overrides", None), list) and all("=" in e and not e.startswith("-")
                                                                          for e in extra)):  # fmt: skip
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    configure(verbosity(args.quiet, args.verbose))
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    status = int(importlib.import_module(args._module).run(args) or 0)
    sys.stdout.flush()  # a failing stdout (full, closed) fails here, inside the handlers above
    return status


if __name__ == "__main__":
    sys.exit(main())
