"""`headstart bench`: vanilla, PLD and headstart heads on the same prompts, interleaved."""

from __future__ import annotations

import argparse

from headstart.bench.session import baselines
from headstart.commands.common import add_target_arguments, load_target_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument(
        "--heads",
        action="append",
        default=[],
        metavar="[LABEL=]DIR_OR_HUB_ID",
        help="trained heads to measure as headstart:LABEL (repeatable; LABEL defaults to the directory name); "
        "default: the heads shipped for the embedded smollm2 target",
    )
    parser.add_argument(
        "--draft-model",
        dest="draft",
        action="append",
        default=[],
        metavar="[LABEL=]MODEL",
        help="a draft model to measure as draft:LABEL beside the heads (repeatable): anything --target "
        "takes with the target's tokenizer, or early-exit:K (the target's first K layers); tree: --tree, else "
        "the one `headstart tune --draft-model` stored here, else chain:4; or lookahead:window=W,ngram=N,guesses=G "
        "(its own tree: not with --tree)",
    )
    parser.add_argument(
        "--questions",
        default=None,
        help="JSONL (MT-bench/Spec-Bench turns, HumanEval prompt, prompt/text) or a name: mt_bench, humaneval",
    )
    parser.add_argument("--limit", type=int, default=None, help="first N questions only")
    parser.add_argument(
        "--shard",
        default=None,
        metavar="K/N",
        help="measure every N-th question from the K-th only (run the N shards in parallel, then --merge)",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="DIR",
        help="measure nothing: merge the finished shard directories into one report in --output",
    )
    parser.add_argument(
        "--turns",
        choices=("first", "all"),
        default="first",
        help="all: answer every turn of multi-turn questions, each method after its own earlier answers "
        "(the MT-bench protocol); first: the first turn only",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--baselines",
        default="vanilla,pld,plain",
        help=f"comma list from {','.join(baselines())} (vanilla is always run; plain: headstart's own forward "
        "and CPU kernels without drafts, to tell the kernels' gain from speculation's)",
    )
    parser.add_argument(
        "--tree", default=None, help="tree for the heads (default: the tuned tree stored with them)"
    )
    parser.add_argument("--warmup", type=int, default=1, help="prompts used to warm every method up")
    parser.add_argument(
        "--compile",
        choices=("off", "on", "auto"),
        default="auto",
        help="as generate's: each verify (and the drafters' steps) as compiled graphs, CUDA graphs on a GPU; "
        "auto: on CUDA only (default)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the questions an interrupted run of the same command finished (in --output) and "
        "measure only the rest",
    )
    parser.add_argument(
        "--output", required=True, help="directory for report.json, report.md, outputs.jsonl, plots"
    )


def run(args: argparse.Namespace) -> int:
    from headstart.bench import session

    return session.run(args, lambda: load_target_from_args(args))
