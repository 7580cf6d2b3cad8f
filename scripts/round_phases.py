#!/usr/bin/env python3
"""Where a steady-state speculative round's eager ops are, by the engine's phases (draft, verify,
accept, commit): random EAGLE-3 heads on the tests' tiny Llama, eager, `--compile on` as the
round's steps compiled one by one, and `--compile on` as one round program
(inference/captured_round.py), a chain and EAGLE's 60-node dynamic tree, interleaved. Counts are
the same on a loaded machine; the ms are only comparable within one quiet sitting.

    .venv/bin/python scripts/round_phases.py [--backend inductor] [--trees chain:3,dynamic:...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' tiny targets
from tiny import make_target_dir  # noqa: E402

from headstart.heads import HeadSpec, build_head  # noqa: E402
from headstart.inference.decoder import SpeculativeDecoder  # noqa: E402
from headstart.inference.plain import SamplingConfig  # noqa: E402
from headstart.inference.rounds import measure_rounds  # noqa: E402
from headstart.targets import load_target  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--trees", default="chain:3;dynamic:depth=5,top_k=10,total_tokens=60",
                        help="';'-separated --tree values")  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        target = load_target(str(make_target_dir(Path(root), "llama", seed=11)))
        head = build_head(
            HeadSpec(kind="eagle3", draft_vocab_size=100), target, token_counts=torch.arange(288.0)
        )
        prompt = target.chat.user_prompt_ids("hello there")
        for tree in args.trees.split(";"):
            for mode in ("off", "steps", "program"):
                decoder = SpeculativeDecoder(target, head, tree=tree, compile=mode != "off",
                                             compile_backend=args.backend)  # fmt: skip
                if mode == "steps":
                    decoder.captured_round = None
                figures = (
                    measure_rounds(decoder, prompt, SamplingConfig(max_new_tokens=args.max_new_tokens)) or {}
                )
                keep = ("host_reads", "compiled_calls", "eager_ops", "eager_by_phase", "ms")
                print(
                    json.dumps({"compile": mode, "tree": tree, **{k: figures.get(k) for k in keep}}),
                    flush=True,
                )


if __name__ == "__main__":
    main()
