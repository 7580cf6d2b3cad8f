#!/usr/bin/env python3
"""The ledger of the accumulating EAGLE-3 run (recipes/smollm2-eagle3-windows-gpu.yaml): one entry
per GPU window, in docs/results/gpu-windows/smollm2-eagle3-run.json, and the CPU verdict that
decides whether a window's head becomes the run's (and the shipped) head.

    python3 scripts/gpu/windows.py next                    # the next window's number (its seed)
    python3 scripts/gpu/windows.py record runs/gpu-window [--card NAME] [--date YYYY-MM-DD] [--start HEAD]
        # evaluates the window's head and the head it started from (default: the shipped one) on
        # the CPU, on the same held-out turns with the same command (fp32, no autocast), and
        # appends the window to the ledger
    python3 scripts/gpu/windows.py promote runs/gpu-window  # the window's head replaces the shipped one

`next` runs on the bare GPU machine (standard library only); `record` and `promote` run here.
A window's head is adopted only if its CPU held-out estimate beats the starting head's by more
than the noise (NOISE below) on the short held-out turns or the long ones (LONG_EVAL) and is not
worse than the noise on the other, and it is not worse at EAGLE's reference tree (the bench that
`record` prints the command for); `promote` then copies it over the shipped head, so the
repository keeps one copy of the run's state and the next window starts from it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEDGER = ROOT / "docs" / "results" / "gpu-windows" / "smollm2-eagle3-run.json"
RECIPE = "recipes/smollm2-eagle3-windows-gpu.yaml"
SHIPPED = ROOT / "headstart" / "default_heads" / "smollm2-eagle3"
# The held-out estimate's noise on the 96 sgeval turns: ~0.015 between seeds of the same recipe
# (docs/results/scaling/smollm2-eagle3-ablations-cpu.md); the same head evaluated twice gives the
# same figure, so this is the bar for "a different head is better", not for repeatability.
NOISE = 0.015
# The long-context held-out set beside the 96 sgeval turns (issue 69): 48 ShareGPT_V3 first turns
# of 257-1,536 tokens (rows 800+, never trained on) with replies up to 512, evaluated at a length
# that holds every row; a head that gains on short prompts and loses on long ones is not adopted.
LONG_EVAL = ("data/smollm2-kept/sglong-eval", 2048)
# Where the run started: the shipped head's own training (its config.json training record).
ORIGIN = {"steps": 2500, "global_batch": 32, "note": "the shipped head: 1,400 + 1,100 steps on 5,351 CPU-"
          "distilled chat and math conversations (experiments/smollm2-scaling), before the first window"}  # fmt: skip


def ledger() -> dict:
    if LEDGER.is_file():
        return json.loads(LEDGER.read_text())
    return {"run": RECIPE, "origin": ORIGIN, "windows": []}


def cmd_next(_: argparse.Namespace) -> None:
    print(len(ledger()["windows"]) + 1)


def evaluate(head: Path, out: Path, held_out: tuple[str, int] | None = None) -> dict:
    """The held-out evaluation of `head` on the CPU: train with max_steps=0 re-evaluates and
    re-saves the head given by init_from (the same turns and TTT depth as the window's own);
    `held_out`: (a distilled folder, the length to evaluate it at) instead of the recipe's."""
    command = [sys.executable, "-m", "headstart", "train", "--recipe", RECIPE, f"init_from={head}", "max_steps=0",
               f"output_dir={out}", "cpu=true", "mixed_precision=no", "batch_size=8", "trackers=[none]", "-q"]  # fmt: skip
    if held_out is not None:
        command[-1:-1] = [f"data.eval_path=[{held_out[0]}]", f"data.max_length={held_out[1]}"]
    subprocess.run(command, cwd=ROOT, check=True)
    result = json.loads((out / "results.json").read_text())["final_eval"]
    from headstart.provenance import placeheld

    # the evaluation's own folder as $EVAL_DIR, the checkout's paths relative (issue 67: no machine paths)
    recorded = placeheld(" ".join(command[1:]), {str(out.parent): "$EVAL_DIR", str(ROOT) + "/": ""})
    return {k: round(v, 4) for k, v in result.items() if isinstance(v, float)} | {"command": recorded}


def verdict(gain: float, long_gain: float | None) -> bool:
    """Whether a window's head beats its start: better than the noise on one held-out set and not
    worse than it on the other (only the short set where the long one was not evaluated)."""
    if long_gain is None:
        return gain > NOISE
    return min(gain, long_gain) > -NOISE and max(gain, long_gain) > NOISE


def _staged(command: str | None) -> str | None:
    """A window's own training command without the GPU machine's folders (its staged heads, as
    init_from=/root/w1, become $STAGE/w1)."""
    import re

    return None if command is None else re.sub(r"(?<![\w.])/(?:[\w.+-]+/)*([\w.+-]+)", r"$STAGE/\1", command)


def cmd_record(args: argparse.Namespace) -> None:
    folder = Path(args.folder).resolve()
    results = json.loads((folder / "runs" / "window-eagle3" / "results.json").read_text())
    number = int((folder / "runs" / "window-number.txt").read_text())
    head = folder / "window-head"
    book = ledger()
    if any(w["window"] == number for w in book["windows"]):
        sys.exit(f"window {number} is in the ledger already ({LEDGER})")
    with tempfile.TemporaryDirectory(prefix="window-eval-") as tmp:
        new = evaluate(head, Path(tmp) / "new")
        old = evaluate(Path(args.start).resolve(), Path(tmp) / "start")
        new_long = evaluate(head, Path(tmp) / "new-long", LONG_EVAL)
        old_long = evaluate(Path(args.start).resolve(), Path(tmp) / "start-long", LONG_EVAL)
    gain = new["eval/accept_len_est"] - old["eval/accept_len_est"]
    long_gain = new_long["eval/accept_len_est"] - old_long["eval/accept_len_est"]
    adopted_before = [w for w in book["windows"] if w["adopted"]]
    entry = {
        "window": number,
        "date": args.date or time.strftime("%Y-%m-%d"),
        "card": args.card,
        "command": _staged(results.get("command")),
        "seed": number,
        "steps": results["steps"],
        "train_tokens": results["tokens"],
        "wall_s": results["wall_s"],
        "tokens_per_s": results["tokens_per_s"],
        "stopped": results.get("stopped"),
        "gpu_eval_accept_len_est": round(results["final_eval"].get("eval/accept_len_est", float("nan")), 4),
        "start_head": str(Path(args.start).resolve().relative_to(ROOT))
        if Path(args.start).resolve().is_relative_to(ROOT)
        else args.start,
        "cpu_eval": {"window_head": new, "start_head": old},
        "cpu_eval_long": {
            "held_out": LONG_EVAL[0],
            "max_length": LONG_EVAL[1],
            "window_head": new_long,
            "start_head": old_long,
        },  # fmt: skip
        "gain": round(gain, 4),
        "long_gain": round(long_gain, 4),
        "beats_start": verdict(gain, long_gain),
        "adopted": False,  # set by `promote`, after the reference-tree bench
        "run_steps_before": ORIGIN["steps"] + sum(w["steps"] for w in adopted_before),
        "run_tokens_before": sum(w["train_tokens"] for w in adopted_before),
    }
    book["windows"].append(entry)
    LEDGER.parent.mkdir(parents=True, exist_ok=True)
    LEDGER.write_text(json.dumps(book, indent=1) + "\n")
    print(json.dumps({k: v for k, v in entry.items() if k not in ("cpu_eval", "cpu_eval_long")}, indent=1))
    print(f"held-out estimate (CPU, fp32): window {new['eval/accept_len_est']:.4f} against the start's "
          f"{old['eval/accept_len_est']:.4f} (short), {new_long['eval/accept_len_est']:.4f} against "
          f"{old_long['eval/accept_len_est']:.4f} (long): {'beats it' if entry['beats_start'] else 'does not beat it'} "
          f"(noise {NOISE}: better on one set, not worse on the other)")  # fmt: skip
    print("next, the reference tree (adopt only if not worse):\n  headstart bench --target smollm2 --threads 2 "
          "--questions ../shared/data/eval/mt_bench/question.jsonl --shard 1/5 --max-new-tokens 128 "
          f"--heads window={head} --heads shipped={SHIPPED} --tree 'dynamic:depth=6,top_k=10,total_tokens=60' "
          "--baselines vanilla --output runs/bench-window-reftree")  # fmt: skip


def cmd_promote(args: argparse.Namespace) -> None:
    folder = Path(args.folder).resolve()
    number = int((folder / "runs" / "window-number.txt").read_text())
    book = ledger()
    entry = next((w for w in book["windows"] if w["window"] == number), None)
    if entry is None or not entry["beats_start"]:
        sys.exit(f"window {number} is not recorded as beating its start: run `record` first")
    for name in ("model.safetensors", "config.json", "README.md"):
        shutil.copy2(folder / "window-head" / name, SHIPPED / name)
    entry["adopted"] = True
    entry["reference_tree"] = args.reference_tree
    LEDGER.write_text(json.dumps(book, indent=1) + "\n")
    describe_lineage(book)
    print(f"window {number}'s head is now {SHIPPED} (re-tune its tree: headstart tune)")


def cmd_continue(args: argparse.Namespace) -> None:
    """Adopt a head continued OFF the windows (a CPU run of another recipe, its every check passed:
    the caller's `--evidence`): its files become the shipped head's and the ledger keeps it under
    `continuations`, so the card's lineage keeps it when a later window is promoted."""
    head = Path(args.head).resolve()
    results = json.loads(Path(args.results).read_text())
    book = ledger()
    book.setdefault("continuations", []).append({
        "date": args.date or time.strftime("%Y-%m-%d"), "card": args.card, "recipe": args.recipe,
        "steps": results["steps"], "train_tokens": results["tokens"], "evidence": args.evidence,
    })  # fmt: skip
    for name in ("model.safetensors", "config.json", "README.md"):
        shutil.copy2(head / name, SHIPPED / name)
    LEDGER.write_text(json.dumps(book, indent=1) + "\n")
    describe_lineage(book)
    print(f"{head} is now {SHIPPED} (re-tune its tree: headstart tune)")


def describe_lineage(book: dict) -> None:
    """The shipped head's card and config say how many windows, steps and tokens made it (and
    any continuation adopted off the windows), in date order."""
    adopted = [w for w in book["windows"] if w["adopted"]]
    steps = [(w["date"], 0, w) for w in adopted] + [(c["date"], 1, c) for c in book.get("continuations", [])]
    lines = [
        f"- before the first window: {ORIGIN['note']} ({ORIGIN['steps']} steps of {ORIGIN['global_batch']})"
    ]
    for _, kind, w in sorted(steps, key=lambda item: item[:2]):
        if kind:
            lines.append(f"- continued ({w['date']}, {w['card']}, {w['recipe']}): {w['steps']} steps, "
                         f"{w['train_tokens'] / 1e6:.2f}M train tokens; {w['evidence']}")  # fmt: skip
            continue
        lines.append(
            f"- window {w['window']} ({w['date']}, {w['card']}): {w['steps']} steps of 128, "
            f"{w['train_tokens'] / 1e6:.1f}M train tokens, held-out estimate {w['cpu_eval']['window_head']['eval/accept_len_est']:.3f} "
            f"(from {w['cpu_eval']['start_head']['eval/accept_len_est']:.3f}); {w.get('reference_tree') or ''}"
        )
    tokens = sum(w["train_tokens"] for w in adopted)
    summary = (f"{len(adopted)} GPU windows of recipes/smollm2-eagle3-windows-gpu.yaml on top of the earlier head: "
               f"{sum(w['steps'] for w in adopted)} steps, {tokens / 1e6:.1f}M train tokens")  # fmt: skip
    continued = book.get("continuations", [])
    if continued:
        summary += f", and {len(continued)} continuation(s) off the windows ({', '.join(c['recipe'] for c in continued)})"
    config_path = SHIPPED / "config.json"
    config = json.loads(config_path.read_text())
    config["training"]["lineage"] = {
        "summary": summary,
        "ledger": str(LEDGER.relative_to(ROOT)),
        "windows": lines,
    }
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    card = SHIPPED / "README.md"
    text = card.read_text().split("\n## How it was made")[0].rstrip()
    card.write_text(
        f"{text}\n\n## How it was made\n\n{summary} (the ledger: `{LEDGER.relative_to(ROOT)}`; each step "
        "continued from the head before it; the windows on the kept data, under warmup-stable-decay):\n\n"
        + "\n".join(lines)
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("next").set_defaults(fn=cmd_next)
    record = sub.add_parser("record")
    record.add_argument("folder")
    record.add_argument("--card", default="unknown")
    record.add_argument("--date")
    record.add_argument("--start", default=str(SHIPPED), help="the head the window started from")
    record.set_defaults(fn=cmd_record)
    promote = sub.add_parser("promote")
    promote.add_argument("folder")
    promote.add_argument("--reference-tree", required=True, help="the bench's tau, window against shipped")
    promote.set_defaults(fn=cmd_promote)
    cont = sub.add_parser("continue", help="adopt a head continued off the windows (e.g. a CPU run)")
    cont.add_argument("head", help="the head's bf16 export (headstart export --dtype bfloat16)")
    cont.add_argument("--results", required=True, help="its run's results.json (steps, tokens)")
    cont.add_argument("--recipe", required=True)
    cont.add_argument("--evidence", required=True, help="what the checks said (held-out, decoding)")
    cont.add_argument("--card", default="CPU")
    cont.add_argument("--date")
    cont.set_defaults(fn=cmd_continue)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
