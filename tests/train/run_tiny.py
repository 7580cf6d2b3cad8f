"""A training run on a tiny target, as a script: used by the SIGKILL/resume test and under
`accelerate launch`. Usage: python run_tiny.py TARGET_DIR OUTPUT_DIR [--resume] [--vary] [overrides...]"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from tiny_data import self_distilled  # noqa: E402

from headstart.config import load_config  # noqa: E402
from headstart.targets import load_target  # noqa: E402
from headstart.train.config import TrainConfig  # noqa: E402
from headstart.train.loop import train  # noqa: E402


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)  # reproducible float sums across runs, and polite on a shared CPU
    target_dir, output_dir, *rest = argv
    resume, vary = "--resume" in rest, "--vary" in rest
    overrides = [a for a in rest if a not in ("--resume", "--vary")]
    target = load_target(target_dir)
    data = self_distilled(target, vary=vary)
    cfg = load_config(
        TrainConfig, None, [f"target={target_dir}", f"output_dir={output_dir}", "trackers=[none]", *overrides]
    )
    train(cfg, data=data, resume=resume, target=target)


if __name__ == "__main__":
    main(sys.argv[1:])
