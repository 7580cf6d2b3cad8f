"""Held-out estimated accept length against training tokens, one line per run, from each
OUT/NAME/results.json or, for a run still going (or cut), its newest checkpoint's state: the
curves of issue 57's 4x-budget runs (eval_every=300 gives four points over 1,200 steps).

    python3 experiments/smollm2-ablations/curves.py runs/ablate-se-4x --output docs/results/scaling/NAME.png

Training tokens at an evaluation = its step x the run's mean tokens per step (the data order is
fixed by the seed, so runs of one recipe see the same tokens; the mean is exact at the end).
Prints the points as a markdown table; --output also draws them (matplotlib: `pip install -e ".[plots]"`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def points(run: Path) -> list[tuple[int, float, float]]:
    """[(step, training tokens, est. accept)] of one run's held-out evaluations."""
    results = run / "results.json"
    if results.is_file():
        state = json.loads(results.read_text())
        per_step = state["tokens"] / max(1, state["steps"])
    else:
        saved = sorted(run.glob("checkpoints/*/trainer_state.json"), key=lambda p: p.stat().st_mtime)
        if not saved:
            return []
        state = json.loads(saved[-1].read_text())
        per_step = state.get("tokens", 0.0) / max(1, state["step"])
    return [(h["step"], h["step"] * per_step, h["eval/accept_len_est"]) for h in state["history"]
            if h.get("kind") == "eval" and "eval/accept_len_est" in h]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the runs' folder (OUT of ablate_smollm2_kept.sh)")
    parser.add_argument("--output", default=None, help="a .png to draw the curves into")
    args = parser.parse_args()
    curves = {run.name: points(run) for run in sorted(Path(args.out).iterdir()) if run.is_dir()}
    curves = {name: pts for name, pts in curves.items() if pts}
    print("| run | step | training tokens | est. accept |\n|---|---:|---:|---:|")
    for name, pts in curves.items():
        for step, tokens, est in pts:
            print(f"| {name} | {step} | {tokens:,.0f} | {est:.3f} |")
    if args.output:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for name, pts in curves.items():
            ax.plot([p[1] / 1e6 for p in pts], [p[2] for p in pts], marker="o", label=name)
        ax.set_xlabel("training tokens (millions)")
        ax.set_ylabel("held-out est. accept length (6 draft steps)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.output, dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
