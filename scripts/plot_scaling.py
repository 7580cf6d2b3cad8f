"""The data-scaling report of EAGLE-3 heads: held-out top-1 per TTT step and the estimated accept
length of each training run, against its data size and steps. Reads the runs' results.json
(what `headstart train` writes), writes NAME.json (the numbers), NAME.md (a table) and NAME.png.
A run continued from another (init_from) is given as PATH@STEPS, STEPS being the steps before it;
NAME=PATH names a run (default: its output_dir's name).

    .venv/bin/python scripts/plot_scaling.py --output docs/results/scaling/smollm2-eagle3-gpu \\
        runs/scaling/eagle3-4000/results.json runs/scaling/eagle3-5351/results.json \\
        runs/smollm2-eagle3-gpu/results.json runs/smollm2-eagle3-gpu2/results.json@1400
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def summary(arg: str, batch_size: int) -> dict:
    name, _, rest = arg.rpartition("=") if "=" in arg.split("@")[0] else ("", "", arg)
    path, _, before = rest.partition("@")
    r = json.loads(Path(path).read_text())
    final = r["final_eval"]
    steps = sorted(int(k.rsplit("step", 1)[1]) for k in final if k.startswith("eval/top1/step"))
    conversations = sum(
        int(n) for n in re.findall(r"\((\d+) conversations\)", r["data"].split("(held out")[0])
    )
    cap = re.search(r"data\.max_records=(\d+)", r["command"])  # the first N only
    conversations = min(conversations, int(cap.group(1))) if cap and int(cap.group(1)) else conversations
    out_dir = re.search(r"output_dir=(\S+)", r["command"])
    return {
        "run": name or (Path(out_dir.group(1)).name if out_dir else Path(path).parent.name),
        "conversations": conversations,
        "steps": r["steps"] + int(before or 0),
        "epochs": round((r["steps"] + int(before or 0)) * batch_size / conversations, 1),
        "wall_s": r["wall_s"],
        "train_tokens_per_s": r["tokens_per_s"],
        "top1": [round(final[f"eval/top1/step{i}"], 4) for i in steps],
        "accept_len_est": round(final["eval/accept_len_est"], 3),
        "evals": [(h["step"], round(h["eval/accept_len_est"], 3)) for h in r.get("history", []) if h.get("kind") == "eval"],
        "command": r["command"],
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", nargs="+", help="results.json paths, PATH@STEPS for a continued run")
    parser.add_argument("--batch-size", type=int, default=32, help="the runs' batch size (for epochs)")
    parser.add_argument("--output", required=True, help="path prefix of the .json, .md and .png")
    parser.add_argument(
        "--x", choices=["epochs", "conversations"], default="epochs",
        help="the right panel's axis: epochs (runs of one data size) or conversations (equal steps, log scale)",
    )  # fmt: skip
    parser.add_argument(
        "--title", default="EAGLE-3 on SmolLM2-135M: held-out acceptance against data and steps"
    )
    args = parser.parse_args()
    runs = [summary(p, args.batch_size) for p in args.results]
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(runs, indent=2) + "\n")
    lines = [
        "| run | conversations | steps | epochs | train tok/s | held-out top-1 per TTT step | est. accept |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in runs:
        top1 = " / ".join(f"{t:.3f}" for t in r["top1"])
        lines.append(
            f"| {r['run']} | {r['conversations']:,} | {r['steps']:,} | {r['epochs']} | {r['train_tokens_per_s']:,.0f} | {top1} | {r['accept_len_est']:.2f} |"
        )
    out.with_suffix(".md").write_text(f"# {args.title}\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (pip install 'headstart[plots]'): no PNG", file=sys.stderr)
        return 0
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        label = f"{r['run']}: {r['conversations']:,} conv, {r['steps']:,} steps"
        left.plot(range(len(r["top1"])), r["top1"], marker="o", label=label)
        at = r[args.x]
        right.plot(at, r["accept_len_est"], "o")
        note = f" {r['conversations']:,} conv" if args.x == "epochs" else f" {r['epochs']} ep"
        right.annotate(note, (at, r["accept_len_est"]))
    if args.x == "conversations":
        right.set_xscale("log")
    left.set_xlabel("TTT step (draft depth - 1)")
    left.set_ylabel("held-out top-1")
    left.legend(fontsize=7)
    right.set_xlabel("epochs over the data" if args.x == "epochs" else "training conversations")
    depth = max(len(r["top1"]) for r in runs)
    right.set_ylabel(f"estimated accept length ({depth} steps)")
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
