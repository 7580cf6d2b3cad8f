"""What `headstart bench` does below its command line: the output rule for a bench folder (its
mark, --resume of an interrupted run, a finished report never measured over), the run itself
(methods interleaved prompt by prompt: vanilla, pld, plain, lookahead, early_exit, each --heads and
--draft-model), and
`--merge` of finished shards. `headstart/commands/bench.py` parses the flags and calls `run`."""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headstart import kinds
from headstart.errors import HeadstartError

if TYPE_CHECKING:
    from headstart.bench.questions import Question
    from headstart.bench.runner import PromptFn


def baselines() -> tuple[str, ...]:
    """vanilla, pld, plain, then each registered drafter with nothing to train (headstart.kinds.
    DRAFT_KINDS: lookahead, early_exit), at what `headstart tune --draft-model NAME` stored here,
    else its defaults (early exit: half the target's layers, chain:4; `--draft-model early-exit:K`
    for others)."""
    return ("vanilla", "pld", "plain", *(kind.baseline for kind in kinds.DRAFT_KINDS.values()))


def _baselines(spec: str) -> list[str]:
    names = list(dict.fromkeys(n.strip() for n in spec.split(",") if n.strip()))  # once each, in order
    unknown = [n for n in names if n not in baselines()]
    if unknown:
        raise HeadstartError(f"unknown baseline(s) {unknown}", f"choose from {','.join(baselines())}")
    return ["vanilla"] + [n for n in names if n != "vanilla"]


def _drafts(args: argparse.Namespace) -> dict[str, str]:
    """{"draft:LABEL": model} of the --draft-model values."""
    return {f"draft:{label}": spec for label, spec in map(_label, args.draft)}


def _label(spec: str) -> tuple[str, str]:
    """'LABEL=WHAT' -> (LABEL, WHAT); a value with no label is named by its last path part. A
    part before '=' holding ':' is no label: `lookahead:window=5,...` is a value of its own."""
    label, sep, path = spec.partition("=")
    if sep and label and path and ":" not in label:
        return label, path
    return Path(spec.rstrip("/")).name or spec, spec


def turn_prompt(target: Any, max_new_tokens: int) -> PromptFn:
    """The runner's PromptFn: the conversation so far (earlier answers decoded as the chat template
    holds them, special tokens dropped and stripped as MT-bench does), checked against the context."""
    limit = getattr(target.config, "max_position_embeddings", None)

    def prompt(question: Question, answers: list[list[int]]) -> list[int]:
        replies = [target.tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in answers]
        ids = target.chat.conversation_ids(question.turns[: len(answers) + 1], replies)
        if limit and len(ids) + max_new_tokens > limit:
            raise HeadstartError(
                f"question {question.question_id} turn {len(answers) + 1}: prompt of {len(ids)} tokens + "
                f"max_new_tokens {max_new_tokens} exceeds the target's context of {limit}",
                "lower --max-new-tokens, use --turns first, or drop that question",
            )
        return ids

    return prompt


def check_bench_output(args: argparse.Namespace) -> None:
    """--output is new, empty, or a bench run's own (resumed with --resume); a finished report is
    never measured over, and a directory of other files is not written into."""
    from headstart.bench.runner import partial_path
    from headstart.outputs import check_output_dir

    if args.limit is not None and args.limit < 1:
        raise HeadstartError(
            f"--limit must be >= 1, got {args.limit}", "use --limit 10, or leave it out for all"
        )
    if args.max_new_tokens < 1:
        raise HeadstartError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}", "use e.g. 128")
    if args.warmup < 0:
        raise HeadstartError(f"--warmup must be >= 0, got {args.warmup}", "use --warmup 1 (or 0)")
    labels = [_label(spec)[0] for spec in args.heads]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise HeadstartError(
            f"--heads gives the label {', '.join(twice)} twice",
            "label each: --heads NAME=DIR (names must differ)",
        )
    if any(not spec.strip() or not _label(spec)[1].strip() for spec in args.heads):
        raise HeadstartError("--heads is empty", "pass a heads directory or Hub id, or leave --heads out")
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise HeadstartError(f"--output {out} is a file", "give --output a directory path (new or empty)")
    check_output_dir(out, "--output")
    if (out / "report.json").is_file() and bench_output(out):
        if not args.resume:
            raise HeadstartError(
                f"{out} already holds a finished bench report",
                "choose a new --output, or delete that one to measure again",
            )
        return
    # a bench run's own files: its mark, or (runs from before the mark) its distinctive partial
    # files; a file merely named outputs.jsonl or report.json is the user's
    ours = [out / BENCH_MARK, partial_path(out / "outputs.jsonl"), out / RUN_CONFIG]
    interrupted = partial_path(out / "outputs.jsonl")
    if not args.resume and (interrupted.is_file() or (out / RUN_CONFIG).is_file()):
        measured = len(interrupted.read_text().splitlines()) if interrupted.is_file() else 0
        raise HeadstartError(
            f"{out} holds an interrupted bench run ({measured} answers measured)",
            "pass --resume to keep its finished questions, or choose a new --output",
        )
    if out.is_dir() and any(out.iterdir()) and not any(path.is_file() for path in ours):
        names = sorted(p.name for p in out.iterdir())
        raise HeadstartError(
            f"--output {out} is not empty ({', '.join(names[:4])}{' ...' if len(names) > 4 else ''}) and holds "
            "no bench run",
            "choose a new or empty --output",
        )


def nothing_to_resume(args: argparse.Namespace) -> int:
    """--resume on a finished run: nothing is measured again; its report is shown when the
    command asked for the same run, and refused when it asked for another."""
    import json
    import logging

    out = Path(args.output)
    try:
        saved = json.loads((out / "report.json").read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        raise HeadstartError(
            f"{out}/report.json is damaged", "choose a new --output, or delete that one to measure again"
        ) from None
    from headstart.heads.defaults import shipped_heads

    heads = {f"headstart:{_label(spec)[0]}": spec for spec in args.heads or
             [f"{label}={path}" for label, path in shipped_heads(args.target).items()]}  # fmt: skip
    asked = {"target": args.target, "questions": args.questions, "turns": args.turns, "shard": args.shard,
             "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "limit": args.limit,
             "heads": heads, "methods": [*_baselines(args.baselines), *heads, *_drafts(args)],
             "compile": getattr(args, "compile", "auto")}  # fmt: skip
    if _drafts(args):
        asked["drafts"] = _drafts(args)
    from headstart.provenance import portable

    # (a report from before a key was kept says nothing about it; reports keep paths portable)
    diff = [
        key for key, value in asked.items() if key in saved and saved[key] not in (value, portable(value))
    ]
    if args.tree and any(tree != args.tree for tree in (saved.get("trees") or {}).values()):
        diff.append("trees")
    if diff:
        raise HeadstartError(
            f"--resume: {out} holds a finished run with other settings ({', '.join(diff)})",
            "repeat that run's command exactly, or choose a new --output",
        )
    logging.getLogger(__name__).warning(
        "nothing to resume: %s holds this run's finished report (%s prompts); nothing was measured again",
        out,
        saved.get("num_prompts"),
    )
    report = out / "report.md"
    if report.is_file():
        print(report.read_text())
    return 0


def merge_run(args: argparse.Namespace) -> int:
    """`--merge`: one report from finished shard directories."""
    from headstart.bench.report import build_report, write_report
    from headstart.bench.shards import merge
    from headstart.outputs import check_output, files_under, publish_dir

    out = Path(args.output)
    folders = [Path(folder) for folder in args.merge]
    if any(out.resolve() == folder.resolve() for folder in folders):
        raise HeadstartError(f"--output {out} is one of the --merge directories", "merge into a new --output")
    if out.is_dir() and bench_output(out) == "run":
        raise HeadstartError(
            f"--output {out} holds a measured bench run: merging would replace its report",
            "merge into a new --output",
        )
    # new, empty or an earlier merge's (its mark); never a protected or foreign folder
    check_output(out, "--output", owned=lambda path: bench_output(path) == "merge", command="bench --merge",
                 inputs=folders, can_overwrite=False)  # fmt: skip
    measuring = [flag for flag, given in (("--questions", args.questions), ("--heads", args.heads),
                 ("--draft-model", args.draft),
                 ("--limit", args.limit is not None), ("--shard", args.shard), ("--resume", args.resume),
                 ("--tree", args.tree)) if given]  # fmt: skip
    if measuring:
        raise HeadstartError(
            f"--merge measures nothing: {', '.join(measuring)} would be ignored",
            f"drop {', '.join(measuring)}",
        )
    config, records = merge(folders)
    report = build_report(config, records, greedy=float(config["temperature"]) == 0.0)
    earlier = files_marked(out)

    def write(tmp: Path) -> None:
        write_report(report, tmp)
        mark(tmp, "merge", files_under(tmp))

    publish_dir(out, write, stale=earlier)  # replaces only the files it writes (and an earlier merge's)
    print((out / "report.md").read_text())
    return 0


BENCH_MARK = ".headstart-bench"
"""A bench output's mark: {"kind": "run" | "merge", "files": [...]}, written before anything else
(a run) or with the report (a merge). It, not a file name, makes a folder bench's own."""


def mark(out: Path, kind: str, files: list[str] | None = None) -> None:
    import json

    from headstart.io import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / BENCH_MARK, json.dumps({"kind": kind, "files": sorted(files or [])}) + "\n")


@dataclass
class BenchMark:
    """What BENCH_MARK holds."""

    kind: str
    files: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind not in ("run", "merge"):
            raise ValueError(f"'kind' is {self.kind!r}, not run or merge")


def read_mark(out: Path) -> BenchMark | None:
    """`out`'s bench mark, or None when it has none or one that is not a bench mark (then `out` is
    not bench's: its files are the user's)."""
    from headstart.records import DamagedFile, read_record

    if not (out / BENCH_MARK).is_file():
        return None
    try:
        return read_record(out / BENCH_MARK, BenchMark, fix="")
    except DamagedFile:
        return None


def bench_output(out: Path) -> str | None:
    """ "run" or "merge" when `out` is a bench output, by its mark alone (a folder whose
    report.json merely looks like a bench report is the user's: bench never writes over it)."""
    found = read_mark(out)
    return found.kind if found is not None else None


def files_marked(out: Path) -> list[str]:
    """The files an earlier merge into `out` wrote (its mark's list): the stale ones a new merge
    may remove."""
    found = read_mark(out)
    return found.files if found is not None else []


def run(args: argparse.Namespace, load_target: Any) -> int:
    """`headstart bench` with its parsed flags; `load_target()` loads the target they name (called
    once the output folder and the flags are checked: a first GGUF load takes ~30 s)."""
    if args.merge:
        return merge_run(args)
    if not args.questions:
        raise HeadstartError("--questions is required", "pass a JSONL file or a name: mt_bench, humaneval")
    check_bench_output(args)  # before the target loads
    created = not Path(args.output).exists()  # this run makes the folder: it may remove it again
    fresh = created or not any(Path(args.output).iterdir())  # nothing of an earlier run to keep
    if (Path(args.output) / "report.json").is_file() and bench_output(
        Path(args.output)
    ):  # --resume, finished
        return nothing_to_resume(args)
    import torch

    from headstart.bench.questions import load_questions
    from headstart.bench.report import build_report, write_report
    from headstart.bench.runner import run_bench
    from headstart.bench.shards import select_shard
    from headstart.inference.plain import SamplingConfig

    sampling = SamplingConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed
    )
    baselines = _baselines(args.baselines)
    every = load_questions(args.questions, limit=args.limit, all_turns=args.turns == "all")
    questions = select_shard(every, args.shard)
    target = load_target()
    torch.manual_seed(args.seed)
    methods, trees, heads, drafts, decoders = _methods(args, target, sampling, baselines)
    prompt = turn_prompt(target, args.max_new_tokens)
    for question in questions:
        prompt(question, [])  # first turns too long for the context fail before any measurement
    out = Path(args.output)
    config = {
        "target": args.target,
        "questions": args.questions,
        "turns": args.turns,
        "shard": args.shard,
        "num_prompts": sum(len(q.turns) for q in questions),  # (question, turn) prompts
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "compile": getattr(args, "compile", "auto"),
        "device": str(target.device),
        "dtype": str(target.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "heads": heads,
        **({"drafts": drafts} if drafts else {}),
        "trees": trees,
        "methods": list(methods),
        "limit": args.limit,
        "questions_total": len(every),  # before --shard: a merge checks its shards cover one set
    }
    done = _resumed(args, out, config, methods, questions)
    try:
        records = run_bench(methods, questions, prompt, out / "outputs.jsonl", warmup=args.warmup, done=done)
    except HeadstartError:  # e.g. a later turn past the context: --resume could not fix it
        if fresh:  # this run's files only: nothing half-written (Ctrl-C keeps them to resume)
            _remove_run(out, created)
        raise
    report = build_report(config, records, greedy=sampling.greedy)
    add_rounds(report, decoders, target, sampling)
    write_report(report, out)
    (out / RUN_CONFIG).unlink(missing_ok=True)
    print((out / "report.md").read_text())
    return 0


def add_rounds(report: dict[str, Any], decoders: dict[str, Any], target: Any, sampling: Any) -> None:
    """Each drafting method's steady-state round, counted on one extra prompt (not a measured
    one): host reads, compiled calls, eager ops, ms (inference/rounds.py), as report.json's
    methods[NAME]["round"]."""
    from headstart.inference.rounds import measure_rounds
    from headstart.inference.timing import CALIBRATION_PROMPTS

    prompt = target.chat.user_prompt_ids(CALIBRATION_PROMPTS[1])
    for name, decoder in decoders.items():
        if name in report["methods"]:
            report["methods"][name]["round"] = measure_rounds(decoder, prompt, sampling)


def _methods(args: argparse.Namespace, target: Any, sampling: Any, baselines: list[str]
             ) -> tuple[dict[str, Any], dict[str, str], dict[str, str], dict[str, str], dict[str, Any]]:  # fmt: skip
    """The methods to measure, in order (baselines, heads, draft models) -> (methods, each
    drafting method's tree, {headstart:LABEL: heads}, {draft:LABEL: draft}, each drafting
    method's decoder)."""
    from headstart.bench import methods as bench_methods
    from headstart.heads.defaults import shipped_heads
    from headstart.inference.captured import wants_capture
    from headstart.speculator import load_speculator

    compile = wants_capture(getattr(args, "compile", "auto"), target.device)
    decoders: dict[str, Any] = {}

    methods = {"vanilla": bench_methods.vanilla(target, sampling)}
    if "pld" in baselines:
        methods["pld"] = bench_methods.pld(target, sampling)
    if "plain" in baselines:
        methods["plain"] = bench_methods.plain(target, sampling)
    trees = {}
    for kind in kinds.DRAFT_KINDS.values():
        name = kind.baseline
        if name not in baselines:
            continue
        try:
            speculator = load_speculator(
                target, greedy=sampling.greedy, draft_model=kind.name, compile=compile
            )
        except HeadstartError:  # a bare name no tune here completed (early exit's layer): its default
            spec = kinds.load(kind.default)(target)
            speculator = load_speculator(target, greedy=sampling.greedy, draft_model=spec, compile=compile)
        methods[name] = bench_methods.speculative(speculator.decoder, sampling)
        decoders[name] = speculator.decoder
        trees[name] = f"{speculator.heads.describe}, {speculator.tree.text}"
    heads_specs = args.heads or [f"{label}={path}" for label, path in shipped_heads(args.target).items()]
    heads = {}
    for spec in heads_specs:
        label, name = _label(spec)
        # resolved (a Hub id downloaded) and loaded once; the tree `headstart tune` stored, unless --tree
        speculator = load_speculator(target, name, args.tree, greedy=sampling.greedy, compile=compile)
        methods[f"headstart:{label}"] = bench_methods.speculative(speculator.decoder, sampling)
        decoders[f"headstart:{label}"] = speculator.decoder
        trees[f"headstart:{label}"] = speculator.tree.text if speculator.tree else "static"
        heads[f"headstart:{label}"] = spec
    drafts = _drafts(args)
    for name, spec in drafts.items():
        speculator = load_speculator(target, tree=args.tree, greedy=sampling.greedy, draft_model=spec,
                                     compile=compile)  # fmt: skip
        methods[name] = bench_methods.speculative(speculator.decoder, sampling)
        decoders[name] = speculator.decoder
        trees[name] = speculator.tree.text if speculator.tree else "static"
    return methods, trees, heads, drafts, decoders


def _remove_run(out: Path, created: bool) -> None:
    """A failed fresh run's files (and its folder, when it made it and nothing else is there)."""
    from headstart.bench.runner import partial_path

    for name in (
        partial_path(out / "outputs.jsonl"),
        out / "outputs.jsonl",
        out / RUN_CONFIG,
        out / BENCH_MARK,
    ):
        name.unlink(missing_ok=True)
    if created and out.is_dir() and not any(out.iterdir()):
        with contextlib.suppress(OSError):
            out.rmdir()


RUN_CONFIG = "config.partial.json"
"""The settings of a run in progress, kept beside its partial outputs so `--resume` can check them."""


def _resumed(
    args: argparse.Namespace, out: Path, config: dict[str, Any], methods: dict, questions: list[Question]
) -> list:
    """Finished questions of an interrupted run when --resume (checked to be the same command);
    records this run's config for a later --resume either way."""
    import json
    import logging

    from headstart.bench.runner import finished_questions, partial_path
    from headstart.bench.shards import SAME

    outputs = out / "outputs.jsonl"
    saved_path = out / RUN_CONFIG
    done = []
    if args.resume:
        if saved_path.is_file():
            saved = json.loads(saved_path.read_text())
            diff = [key for key in (*SAME, "shard", "trees") if saved.get(key) != config.get(key)]
            if diff:
                raise HeadstartError(
                    f"--resume: the interrupted run in {out} used other settings ({', '.join(diff)})",
                    "repeat the interrupted command exactly, or drop --resume to start over",
                )
        elif partial_path(outputs).is_file():
            logging.getLogger(__name__).warning(
                "--resume: %s has no saved settings to check against; make sure the command is the same",
                out,
            )
        done = finished_questions(outputs, methods, questions)
        print(
            f"resuming: {len({r.question_id for r in done})} of {len(questions)} questions already measured"
        )
    mark(out, "run")  # first: from here the folder is this run's (a foreign one was refused before)
    tmp = saved_path.with_name(saved_path.name + ".tmp")
    tmp.write_text(json.dumps(config, indent=1))
    tmp.replace(saved_path)
    return done
