"""The table of experiments/smollm2-ablations/ablate_smollm2.sh: one row per variant (its overrides, held-out top-1 per
TTT step, estimated accept length, train tokens/s, wall time), from each OUT/NAME/results.json.

    python3 experiments/smollm2-ablations/ablation_table.py runs/ablate --output docs/results/scaling/smollm2-eagle3-ablations-cpu.json
prints the markdown table and, with --output, writes the numbers as JSON (the report's prose,
NAME.md beside it, is written by hand around the table).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path


def row(results: Path) -> dict:
    r = json.loads(results.read_text())
    final = r["final_eval"]
    depth = sorted(int(k.rsplit("step", 1)[1]) for k in final if k.startswith("eval/top1/step"))
    words = shlex.split(r["command"])  # the variant's own overrides, unquoted
    recipe_keys = [w for w in words if re.match(r"(?:loss|head|optim|data)\.[\w.]+=", w)]
    return {
        "variant": results.parent.name,
        "overrides": " ".join(recipe_keys),
        "steps": r["steps"],
        "top1": [round(final[f"eval/top1/step{i}"], 4) for i in depth],
        "accept_len_est": round(final["eval/accept_len_est"], 3),
        "train_tokens_per_s": r["tokens_per_s"],
        "wall_s": r["wall_s"],
        "command": r["command"],
    }


def markdown(rows: list[dict]) -> str:
    depth = max(len(r["top1"]) for r in rows)
    head = "| variant | overrides | est. accept | " + " | ".join(f"top-1 step {j}" for j in range(depth))
    lines = [head + " | train tok/s | wall s |", "|" + "---|" * 2 + "---:|" * (depth + 3)]
    for r in rows:
        top1 = " | ".join(f"{a:.3f}" for a in r["top1"])
        lines.append(
            f"| {r['variant']} | `{r['overrides'] or '-'}` | {r['accept_len_est']:.3f} | {top1} |"
            f" {r['train_tokens_per_s']} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the ablations' OUT folder (default runs/ablate)")
    parser.add_argument("--output", type=Path, help="also write the rows to this JSON file")
    args = parser.parse_args()
    found = sorted(args.root.glob("*/results.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        sys.exit(f"no */results.json under {args.root}: run experiments/smollm2-ablations/ablate_smollm2.sh first")
    rows = [row(p) for p in found]
    print(markdown(rows), end="")
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
