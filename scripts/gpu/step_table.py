"""The step-time table of a training run: one row per train log entry of its results.json
(steps, loss, seconds a step, train tokens/s, learning rate) and its held-out evaluations.

    python3 scripts/gpu/step_table.py runs/epochs-eagle3/results.json > steps.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def table(results: dict) -> str:
    lines = [
        f"{results.get('steps')} steps, {results.get('tokens')} train tokens in {results.get('wall_s')} s "
        f"({results.get('tokens_per_s')} tok/s over the run, start-up and evaluations included)",
        "",
        "| step | loss | s/step | train tok/s | lr | held-out est. accept |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for entry in results.get("history", []):
        if entry.get("kind") == "train":
            lines.append(
                f"| {entry['step']} | {entry['loss']:.4f} | {entry.get('step_s', '')} | "
                f"{entry.get('tokens_per_s', '')} | {entry.get('lr', 0):.2e} | |"
            )
        elif entry.get("kind") == "eval" and "eval/accept_len_est" in entry:
            lines.append(f"| {entry['step']} | | | | | {entry['eval/accept_len_est']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(table(json.loads(Path(sys.argv[1]).read_text())), end="")
