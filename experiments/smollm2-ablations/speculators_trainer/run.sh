#!/bin/bash
# Recipe parity (issue 36 item 4): speculators 0.9.0's own EAGLE-3 trainer against headstart's, on
# the same 600 distilled SmolLM2 conversations, the same 300 steps (~609k tokens), the same draft
# vocabulary (8,192; speculators builds the identical set) and TTT depth (4, decay 0.8), both
# heads scored by headstart's held-out evaluator (train init_from=... max_steps=0). Results and
# the differences that remain: docs/results/scaling/smollm2-eagle3-vs-speculators-cpu.md.
# From the repository root, after the data of experiments/smollm2-ablations/train_smollm2_eagle3_ablate.yaml exists:
#   experiments/smollm2-ablations/speculators_trainer/run.sh venv      # /tmp/specvenv: torch 2.13 CPU + speculators 0.9.0
#   experiments/smollm2-ablations/speculators_trainer/run.sh data      # runs/spec/specdata (1.4 GB of float32 features)
#   experiments/smollm2-ablations/speculators_trainer/run.sh train     # ~48 min at 1 thread on this CPU
#   experiments/smollm2-ablations/speculators_trainer/run.sh score     # headstart's evaluator on its last checkpoint
# Environment: TRAIN, EVAL (distilled dirs, default runs/distill-smollm2-sg600 and -sgeval),
# TARGET_DIR (the target's HF dir), VENV (default /tmp/specvenv), THREADS (default 1).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${VENV:-/tmp/specvenv}
TRAIN=${TRAIN:-runs/distill-smollm2-sg600}
EVAL=${EVAL:-runs/distill-smollm2-sgeval}
TARGET_DIR=${TARGET_DIR:-$HOME/.cache/headstart/gguf/b179c9523d0e6a0f}
export TRAIN EVAL TARGET_DIR HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=${THREADS:-1}

venv() {
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch==2.13.0   # the CPU wheel first: speculators must not pull CUDA torch
  "$VENV/bin/pip" install -q --no-deps speculators==0.9.0 hs-connectors==0.9.0
  echo "torch==2.13.0" > /tmp/spec-constraints.txt
  "$VENV/bin/pip" install -q -c /tmp/spec-constraints.txt aiohttp click "datasets>=4.0.0,<=5.1.0" httpx \
    huggingface-hub "loguru>=0.7.2,<=0.7.3" "numpy>=2.0.0,<=2.5.4" "openai>=2.0.0" protobuf psutil \
    "pydantic>=2" "pydantic-settings>=2" rich safetensors "tqdm>=4.66.3,<=4.70.1" "transformers==5.19.0" \
    "typer>=0.12.0" pyyaml
}

data() {
  mkdir -p runs/spec
  "$VENV/bin/python" "$HERE/convert.py" jsonl --out runs/spec/jsonl
  "$VENV/bin/speculators" prepare-data --model "$TARGET_DIR" --data runs/spec/jsonl/train.jsonl \
    --output runs/spec/prep/train --seq-length 384 --no-skip-token-freq --num-preprocessing-workers 1
  "$VENV/bin/speculators" prepare-data --model "$TARGET_DIR" --data runs/spec/jsonl/eval.jsonl \
    --output runs/spec/prep/eval --seq-length 384 --num-preprocessing-workers 1
  "$VENV/bin/python" "$HERE/convert.py" assemble --prep runs/spec/prep --out runs/spec/specdata
}

train() {
  mkdir -p runs/spec/run
  # shellcheck disable=SC2046  # the flags are words on purpose
  SPEC_THREADS=${THREADS:-1} SPEC_METRICS=runs/spec/run/metrics.jsonl "$VENV/bin/python" "$HERE/spec_train_cpu.py" \
    $(sed "s#TARGET_DIR#$TARGET_DIR#" "$HERE/train_args.txt") --save-path runs/spec/ckpt --log-dir runs/spec/run/logs
}

score() {
  local last
  last=$(ls -d runs/spec/ckpt/[0-9]* | sort -V | tail -1)
  headstart train --recipe experiments/smollm2-ablations/train_smollm2_eagle3_ablate.yaml init_from="$last" max_steps=0 \
    output_dir=runs/spec/scored "data.path=[$TRAIN]" "data.eval_path=[$EVAL]"
}

"$@"
