"""`headstart serve`: the target (and its heads) behind an OpenAI-compatible HTTP API, decoding
speculatively with continuous batching. Greedy replies are exactly `headstart generate`'s."""

from __future__ import annotations

import argparse
import importlib.util
import logging
from typing import Any

from headstart.commands.common import add_target_arguments, load_target_from_args
from headstart.commands.generate import add_decoding_arguments
from headstart.errors import HeadstartError

log = logging.getLogger("headstart.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    add_decoding_arguments(parser)
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    group.add_argument("--port", type=int, default=8000)
    group.add_argument(
        "--served-model-name", default=None, help="the model id clients use (default: --target)"
    )
    group.add_argument(
        "--api-key", default=None, help="require `Authorization: Bearer KEY` (compared in constant time)"
    )
    group.add_argument(
        "--max-batch", type=int, default=8, help="requests decoded together per sampling setting"
    )
    group.add_argument("--max-queue", type=int, default=64, help="requests waiting before 429")
    group.add_argument("--allowed-origins", nargs="+", default=[], metavar="ORIGIN",
                       help="CORS: web pages from these origins (e.g. http://localhost:3000, or *) may call "
                       "the API from a browser (default: none)")  # fmt: skip
    group.add_argument("--max-tokens", type=int, default=None, help="the most tokens a request may ask for, "
                       ">= 1 (default: the target's context)")  # fmt: skip
    group.add_argument("--max-body-mb", type=float, default=16.0, help="the largest request body in MiB: "
                       "a larger one gets a 413 before it is read (default: 16)")  # fmt: skip
    group.add_argument("--body-timeout", type=float, default=30.0, help="seconds a request body may take "
                       "to arrive: a slower one gets a 408 and its connection is closed (default: 30)")  # fmt: skip
    group.add_argument("--header-timeout", type=float, default=10.0, help="seconds a request's headers may "
                       "take to arrive: a slower client gets a 408 and its connection is closed (default: 10)")  # fmt: skip
    group.add_argument("--default-max-tokens", type=int, default=512,
                       help="a chat request without max_tokens gets at most this many")  # fmt: skip
    group.add_argument("--grace", type=float, default=30.0, help="seconds running requests get on SIGTERM")
    group.add_argument(
        "--speculate-up-to",
        type=int,
        default=None,
        metavar="TOKENS",
        help="speculate while live requests x tree nodes stay within TOKENS verify tokens, else decode "
        "plainly (default: one request's tree on a CPU, where a verify's cost grows with its tokens; "
        "no limit on a GPU)",
    )
    group.add_argument(
        "--record",
        default=None,
        metavar="DIR",
        help="keep every finished reply, as the target produced it (token ids; no text, headers or keys), "
        "in DIR, a data set `headstart train` reads as data.path; only you can read it (default: off)",
    )
    group.add_argument("--record-max-mb", type=float, default=1024.0,
                       help="--record stops (said once; serving goes on) when DIR holds this many MiB (default 1024)")  # fmt: skip
    group.add_argument(
        "--prefix-cache",
        type=int,
        default=8,
        metavar="TOKENS",
        help="requests whose prompts open with the same >= TOKENS tokens (a chat template's system turn) "
        "reuse one prefill of them, kept across requests (with heads, the target layers they read are "
        "kept too); 0: off (default: 8)",
    )


def check_arguments(args: argparse.Namespace) -> None:
    for flag, value, least in (("--port", args.port, 0), ("--max-batch", args.max_batch, 1),
                               ("--speculate-up-to", args.speculate_up_to or 0, 0), ("--prefix-cache", args.prefix_cache, 0),
                               ("--max-queue", args.max_queue, 1), ("--default-max-tokens", args.default_max_tokens, 1),
                               ("--max-tokens", 1 if args.max_tokens is None else args.max_tokens, 1)):  # fmt: skip
        if value < least:
            raise HeadstartError(f"{flag} must be >= {least}, got {value}", f"fix {flag}")
    if args.port > 65535:
        raise HeadstartError(f"--port must be <= 65535, got {args.port}", "use e.g. --port 8000")
    if not args.grace >= 0:
        raise HeadstartError(f"--grace must be >= 0, got {args.grace}", "use e.g. --grace 30")
    if not 0 < args.body_timeout < float("inf"):
        raise HeadstartError(
            f"--body-timeout must be > 0, got {args.body_timeout}", "use e.g. --body-timeout 30"
        )
    if not 0 < args.header_timeout < float("inf"):
        raise HeadstartError(
            f"--header-timeout must be > 0, got {args.header_timeout}", "use e.g. --header-timeout 10"
        )
    if not 0 < args.record_max_mb < float("inf"):
        raise HeadstartError(
            f"--record-max-mb must be > 0, got {args.record_max_mb}", "use e.g. --record-max-mb 1024"
        )
    if args.record is not None:
        from headstart.outputs import check_output_dir

        check_output_dir(args.record, "--record")
    if not 0 < args.max_body_mb < float("inf"):
        raise HeadstartError(
            f"--max-body-mb must be > 0, got {args.max_body_mb}", "use e.g. --max-body-mb 16"
        )
    from headstart.serve.lifecycle import check_listen

    check_listen(args.host, args.port)
    for origin in args.allowed_origins:
        if origin != "*" and not origin.startswith(("http://", "https://")):
            raise HeadstartError(f"--allowed-origins {origin!r} is not an origin",
                                 "give scheme://host[:port], e.g. http://localhost:3000, or *")  # fmt: skip
    if args.api_key is not None and not args.api_key.strip():
        raise HeadstartError("--api-key is empty", "pass a key, or leave --api-key out")
    if args.stop:
        raise HeadstartError("--stop is per request in a server", "send `stop` in the request body")
    missing = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise HeadstartError(
            f"headstart serve needs {' and '.join(missing)}", "pip install 'headstart[serve]'"
        )


def run(args: argparse.Namespace) -> int:
    from headstart.commands.common import check_generation_args
    from headstart.commands.generate import decoding_from_args

    check_arguments(args)
    args.max_new_tokens, args.temperature, args.top_p, args.top_k, args.seed = 1, 0.0, 1.0, 0, None
    check_generation_args(args)
    target = load_target_from_args(args)
    from headstart.targets.exactness import check_no_processors

    check_no_processors(target.model)  # served greedy replies are generate's, with or without heads
    if not target.chat.has_template:
        log.warning(
            "warning: %s has no chat template: /v1/chat/completions will refuse requests", target.spec
        )
    decoding = decoding_from_args(args, target)  # the heads and tree `generate` would take (the tuned one)
    recorder = None
    if args.record is not None:
        from headstart.serve.record import Recorder

        recorder = Recorder(args.record, target, int(args.record_max_mb * 2**20))
        log.info("recording finished replies into %s (%d kept there)", args.record, recorder.next_index)
    try:
        return _serve(args, target, decoding, recorder)
    finally:
        if recorder is not None:
            recorder.close()


def _serve(args: argparse.Namespace, target: Any, decoding: Any, recorder: Any) -> int:
    from headstart.serve.app import build_app
    from headstart.serve.lifecycle import serve_until_stopped
    from headstart.serve.served import assemble

    served = assemble(
        target, decoding, model=args.served_model_name or args.target, max_batch=args.max_batch,
        max_queue=args.max_queue, speculate_up_to=args.speculate_up_to, prefix_cache=args.prefix_cache,
        max_tokens=args.max_tokens, default_tokens=args.default_max_tokens, api_key=args.api_key,
        allowed_origins=tuple(args.allowed_origins), max_body=int(args.max_body_mb * 2**20),
        body_timeout=args.body_timeout, recorder=recorder,
    )  # fmt: skip
    return serve_until_stopped(build_app(served), served.scheduler, args.host, args.port, args.grace,
                               f"serving {target.spec} as '{served.model}' ({decoding.mode})",
                               header_timeout=args.header_timeout)  # fmt: skip
