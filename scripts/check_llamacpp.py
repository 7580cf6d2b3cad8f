#!/usr/bin/env python
"""An outside reader for `headstart export --format eagle|speculators|dflash`: llama.cpp.

Converts the export with llama.cpp's own `convert_hf_to_gguf.py` (the target's HF directory as
`--target-model-dir`), drafts with it in `llama-speculative-simple --spec-type draft-eagle3` (an
EAGLE-3 export) or `draft-dflash` (a DFlash export in z-lab's layout, `--format dflash`) on
held-out prompts (greedy, a chain of K drafts per step), and decodes the same prompts with
headstart's import of the same directory on the chain tree `chain:K`. Both sides print how many
drafted tokens the target accepted: a head that llama.cpp reads as headstart does accepts at about
the same rate (not exactly: llama.cpp runs the quantised GGUF, headstart its dequantised weights,
so the greedy texts part after a while). Also llama.cpp's plain decode speed (`llama-bench`), and
what a verify of K+1 tokens costs it against one token (`llama-bench -p 1,K+1`): a chain of K pays
off in llama.cpp only where the tokens a step commits exceed that ratio plus the draft's own cost.

    python scripts/check_llamacpp.py --export runs/exported/eagle --llama-cpp path/to/llama.cpp \\
        --gguf path/to/SmolLM2-135M-Instruct.Q4_1.gguf --prompts ../shared/data/eval/mt_bench/question.jsonl \\
        --limit 10 --python path/to/venv-with-sentencepiece/bin/python

The converter needs torch, numpy, transformers and sentencepiece (`--python`); the llama.cpp
build needs `llama-speculative-simple` and `llama-bench` under build/bin.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

STATS = {
    "drafted": re.compile(r"n_drafted\s*=\s*(\d+)"),
    "accepted": re.compile(r"n_accept\s*=\s*(\d+)"),
    "decoded": re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds"),
}


def convert(args: argparse.Namespace, target_dir: Path, out: Path) -> None:
    root = Path(args.llama_cpp)
    cmd = [args.python, str(root / "convert_hf_to_gguf.py"), args.export, "--target-model-dir",
           str(target_dir), "--outtype", "f16", "--outfile", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root / "gguf-py")}  # the tree's gguf, not a pip one
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if run.returncode:
        sys.exit(f"convert_hf_to_gguf.py failed:\n{run.stderr[-3000:]}")
    print(f"converted {args.export} -> {out} ({out.stat().st_size / 2**20:.1f} MiB)")


def spec_type(export: str) -> str:
    """llama.cpp's draft type for the export: draft-dflash for z-lab's DFlash layout, else draft-eagle3."""
    config = json.loads((Path(export) / "config.json").read_text())
    if "dflash_config" in config:
        return "draft-dflash"
    if config.get("speculators_model_type") == "dflash":
        sys.exit("llama.cpp's converter reads DFlash in z-lab's layout: export with --format dflash")
    return "draft-eagle3"


def llama_side(args: argparse.Namespace, draft: Path, prompts: list[str]) -> dict[str, float]:
    binary = Path(args.llama_cpp) / "build" / "bin" / "llama-speculative-simple"
    totals = {"drafted": 0, "accepted": 0, "tokens": 0, "seconds": 0.0}
    for prompt in prompts:
        cmd = [str(binary), "-m", args.gguf, "-md", str(draft), "--spec-type", spec_type(args.export),
               "--spec-draft-n-max", str(args.k), "--spec-draft-p-min", str(args.p_min), "-p", prompt, "-n", str(args.max_new_tokens),
               "--temp", "0", "--top-k", "1", "--seed", "0", "-t", str(args.threads),
               "-td", str(args.threads)]  # fmt: skip
        run = subprocess.run(cmd, capture_output=True, text=True)
        found = {key: pattern.search(run.stderr) for key, pattern in STATS.items()}
        if run.returncode or not all(found.values()):
            sys.exit(f"llama-speculative-simple failed (rc {run.returncode}):\n{run.stderr[-3000:]}")
        totals["drafted"] += int(found["drafted"][1])
        totals["accepted"] += int(found["accepted"][1])
        totals["tokens"] += int(found["decoded"][1])
        totals["seconds"] += float(found["decoded"][2])
    return totals


def batch_cost(args: argparse.Namespace) -> float:
    """What one forward over K+1 tokens (a chain's verify) costs llama.cpp, in single-token forwards.

    `llama-bench -p 1,K+1` times prompt batches of 1 and K+1 tokens (no draft): a step of
    speculation commits at most K+1 tokens for this price plus the draft's. On a CPU whose kernels
    are compute-bound at one token, the ratio nears K+1 and no head can pay.
    """
    binary = Path(args.llama_cpp) / "build" / "bin" / "llama-bench"
    cmd = [str(binary), "-m", args.gguf, "-t", str(args.threads), "-p", f"1,{args.k + 1}", "-n", "0",
           "-r", "5", "-o", "json"]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"llama-bench failed:\n{run.stderr[-3000:]}")
    rates = {row["n_prompt"]: float(row["avg_ts"]) for row in json.loads(run.stdout)}
    return (args.k + 1) / rates[args.k + 1] * rates[1]


def headstart_side(args: argparse.Namespace, questions: list[str]) -> dict[str, float]:
    totals = {"drafted": 0, "accepted": 0, "tokens": 0, "seconds": 0.0}
    for question in questions:  # one call each: repeated --prompt is a batch with shared stats
        cmd = [sys.executable, "-m", "headstart", "-q", "generate", "--target", args.target,
               "--heads", args.export, "--tree", f"chain:{args.k}", "--max-new-tokens",
               str(args.max_new_tokens), "--threads", str(args.threads), "--json", "--prompt", question]  # fmt: skip
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode:
            sys.exit(f"headstart generate failed:\n{run.stderr[-3000:]}")
        stats = json.loads(run.stdout.splitlines()[-1])["stats"]
        stats = stats.get("batch", stats)  # one prompt: its batch's figures are its own
        histogram = {int(n): c for n, c in stats["accept_length_histogram"].items()}
        totals["drafted"] += sum(histogram.values()) * args.k
        totals["accepted"] += sum((n - 1) * c for n, c in histogram.items())
        totals["tokens"] += stats["new_tokens"]
        totals["seconds"] += stats["wall_s"]
    return totals


def plain_llama_speed(args: argparse.Namespace) -> float:
    binary = Path(args.llama_cpp) / "build" / "bin" / "llama-bench"
    cmd = [str(binary), "-m", args.gguf, "-t", str(args.threads), "-p", "0", "-n",
           str(args.max_new_tokens), "-r", "3", "-o", "json"]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"llama-bench failed:\n{run.stderr[-3000:]}")
    return float(json.loads(run.stdout)[0]["avg_ts"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--export", required=True, help="an `eagle`, `speculators` (EAGLE-3) or `dflash` export"
    )
    parser.add_argument("--llama-cpp", required=True, help="llama.cpp source tree with build/bin")
    parser.add_argument("--gguf", required=True, help="the target as GGUF, for llama.cpp")
    parser.add_argument("--target", default="smollm2", help="the same target for headstart")
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--k", type=int, default=3, help="drafts per step (a chain)")
    parser.add_argument(
        "--p-min", type=float, default=0.0,
        help="llama.cpp's --spec-draft-p-min: stop a draft where the head's top probability is lower",
    )  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--python", default=sys.executable, help="python for llama.cpp's converter")
    args = parser.parse_args()

    from headstart.bench.questions import load_questions
    from headstart.targets import load_target

    target = load_target(args.target, weights=False)  # tokenizer, chat template, HF directory
    questions = [q.turns[0] for q in load_questions(args.prompts, limit=args.limit)]
    prompts = [target.tokenizer.decode(target.chat.user_prompt_ids(q)) for q in questions]
    with tempfile.TemporaryDirectory() as tmp:
        draft = Path(tmp) / "draft.gguf"
        convert(args, Path(target.model.name_or_path), draft)
        sides = {"llama.cpp": llama_side(args, draft, prompts), "headstart": headstart_side(args, questions)}
    print(f"{len(questions)} prompts, {args.max_new_tokens} new tokens, greedy, chain of {args.k}, "
          f"{args.threads} threads, {spec_type(args.export)}, llama.cpp p-min {args.p_min}")  # fmt: skip
    print("| decoder | drafted | accepted | accept rate | tokens/s |\n|---|---:|---:|---:|---:|")
    for name, t in sides.items():
        rate = t["accepted"] / max(t["drafted"], 1)
        print(
            f"| {name} + head | {t['drafted']} | {t['accepted']} | {rate:.3f} | {t['tokens'] / t['seconds']:.1f} |"
        )
    print(
        f"| llama.cpp alone (llama-bench tg{args.max_new_tokens}) | - | - | - | {plain_llama_speed(args):.1f} |"
    )
    cost = batch_cost(args)
    print(f"llama.cpp's forward over {args.k + 1} tokens costs {cost:.2f} single-token forwards here "
          f"(llama-bench pp1 and pp{args.k + 1}): a step must commit more than {cost:.2f} tokens "
          f"(accept more than {cost - 1:.2f} of its {args.k} drafts) before the draft's own cost")  # fmt: skip


if __name__ == "__main__":
    main()
