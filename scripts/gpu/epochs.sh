#!/bin/bash
# The one GPU training call: EAGLE-3 for the embedded SmolLM2 trained on the whole kept dataset
# (data/smollm2-kept, 30,520 conversations, 5.74M tokens) for as many epochs as fit the call, the
# run sized to the card by a profile of the step taken first (scripts/profile_train.py: train
# tokens/s, where the step's time goes, FLOPs per token, utilisation against the card's measured
# bf16 peak), and, if time is left after the run, the profile of eager against compiled steps.
# Returns under $OUT (at most 8 files of 16 MB): profile.json (and profile-compile.json),
# logs.tar.gz (the run's log, results.json with its held-out evaluations, steps.md: the
# step-time table of its train log entries), heads.tar.N (the head in bf16, parts of 15 MB).
#
#   scripts/gpu/stage.sh                        # here, once: .gpu/ (wheels, the GGUF in 4 parts)
#   device calls 1-3, back to back (gpu/stage.sh's header: each stages one GGUF part, seconds each)
#   device call 4, the one prepared call (run tool):
#     command: scripts/gpu/epochs.sh device
#     carry:   [".gpu/wheels", ".gpu/smollm2.part4", ".gpu/smollm2.sha256"]
#     timeout_s: 480                             (CALL_S below: its plan ends by then)
#   scripts/gpu/epochs.sh unpack FILES_AT       # here: runs/gpu-epochs (head, logs, profiles)
#
# The plan of the call (CALL_S=470 s of it): preparation (~20 s: the GGUF, the wheels, an import
# check), the sizing profile (PROFILE_S, ~60 s: eager steps at the recipe's batch), training for
# the rest less the collection (TRAIN_S; max_steps from the profiled pace, so the cosine schedule
# ends where the time does; the time budget stops the run cleanly if it is slower and its head
# is then written from the checkpoint), the collection (~30 s), then the compile profile if
# COMPARE_S (120 s) are left. Environment: CALL_S, PROFILE_S, COMPARE_S, TRAIN_ARGS (more recipe
# overrides for the profile and the run), DEVICE (cuda; cpu for the dry run), OUT.
# Dry run on the CPU (every stage, tiny sizes; ~6 minutes on the 2-core host):
#   DEVICE=cpu STAGE=/tmp/stage OUT=/tmp/ge CALL_S=420 PROFILE_S=150 COMPARE_S=0 \
#     TRAIN_ARGS="batch_size=4 data.max_records=400 eval_batches=2" scripts/gpu/epochs.sh device
set -euo pipefail
OUT=${OUT:-runs/epochs-out}
DEVICE=${DEVICE:-cuda}
CALL_S=${CALL_S:-470}
PROFILE_S=${PROFILE_S:-90}
COMPARE_S=${COMPARE_S:-120}
RECIPE=recipes/smollm2-eagle3-kept-gpu.yaml
RUN=runs/epochs-eagle3
source "$(dirname "$0")/common.sh"

device() {
  mkdir -p "$OUT" runs
  [[ -d $RUN ]] && mv "$RUN" "$RUN.before-$(date +%s)"  # a warm machine's earlier call
  gpu_prepare
  local target="$STAGE/smollm2.gguf" cpu=() args
  [[ $DEVICE == cpu ]] && cpu=(cpu=true)
  read -r -a args <<< "${TRAIN_ARGS:-}"
  # 1. the sizing profile: eager steps at the recipe's batch, on the same card
  timeout -k 10 "$PROFILE_S" python scripts/profile_train.py --recipe "$RECIPE" --device "$DEVICE" \
    --batches 4 --warmup 2 --steps 6 --rounds 2 --profile-steps 2 target="$target" "${args[@]}" \
    --output "$OUT/profile.json" > runs/profile.log 2>&1 || { echo "profile: failed"; tail -n 20 runs/profile.log; }
  grep -E "^== |^  |^peak" runs/profile.log || true
  # 2. the run: max_steps from the profiled pace (tokens/s / tokens a step), 85% of what fits
  local left=$(( CALL_S - SECONDS - 40 )) steps
  python - "$OUT/profile.json" "$left" "$RECIPE" "${args[@]}" > runs/epochs-steps.txt <<'PY'
import json, sys
from headstart.config import load_config
from headstart.train.config import TrainConfig
from headstart.train.data import load_distilled_data
path, left, recipe, *overrides = sys.argv[1:]
cfg = load_config(TrainConfig, recipe, overrides)
data = load_distilled_data(cfg.data)
count = data.train_count
tokens = sum(min(len(data.input_ids[i]), cfg.data.max_length) for i in range(count))
per_step = tokens / count * cfg.batch_size
try:
    rate = json.load(open(path))["tokens_per_s"]
except (OSError, KeyError, ValueError):
    rate = 0.0
startup, evals = 40.0, 4 * 8.0  # target and data load, four held-out evaluations (96 turns)
steps = int(0.85 * max(0.0, float(left) - startup - evals) * rate / per_step) if rate else 200
print(max(steps, 8))
print(f"pace {rate:.0f} tok/s, {per_step:.0f} tokens a step, {left} s left: {steps} steps, "
      f"{steps * per_step / tokens:.2f} epochs of {count} conversations", file=sys.stderr)
PY
  steps=$(head -n 1 runs/epochs-steps.txt)
  local every=$(( (steps + 3) / 4 ))  # four evaluations, the last at the end
  echo "train: $steps steps, evaluations every $every, budget $left s"
  local code=0
  headstart train --recipe "$RECIPE" target="$target" output_dir="$RUN" max_steps="$steps" \
    eval_every="$every" time_budget_s="$left" "${cpu[@]}" "${args[@]}" > runs/epochs.log 2>&1 || code=$?
  echo "train: exit $code after $SECONDS s"
  if [[ ! -f $RUN/results.json ]]; then  # stopped by the budget: its head from the checkpoint
    local last
    last=$(ls -d "$RUN"/checkpoints/step-* 2>/dev/null | tail -n 1 || true)
    if [[ -n "$last" ]]; then
      headstart train --recipe "$RECIPE" target="$target" output_dir="$RUN" --resume \
        max_steps="$((10#${last##*step-}))" time_budget_s=0 "${cpu[@]}" "${args[@]}" >> runs/epochs.log 2>&1 || true
    fi
  fi
  collect
  # 3. eager against compiled steps, in one process, if the call has time for it
  if (( CALL_S - SECONDS > COMPARE_S && COMPARE_S > 0 )); then
    timeout -k 10 "$(( CALL_S - SECONDS - 15 ))" python scripts/profile_train.py --recipe "$RECIPE" \
      --device "$DEVICE" --batches 4 --warmup 2 --steps 6 --rounds 2 --profile-steps 1 target="$target" \
      --variant eager:compile=false --variant compiled:compile=true "${args[@]}" \
      --output "$OUT/profile-compile.json" > runs/profile-compile.log 2>&1 || echo "compile profile: cut or failed"
    grep -E "^== " runs/profile-compile.log || tail -n 5 runs/profile-compile.log
  fi
  ls -la "$OUT"
}

collect() {  # the log, results and step-time table in one file; the head as bf16 in 15 MB parts
  grep -E "eval step|start-up took|time budget|error|Error" runs/epochs.log | tail -n 20 || true
  if [[ -f $RUN/results.json ]]; then
    python scripts/gpu/step_table.py "$RUN/results.json" > runs/steps.md
    cat runs/steps.md
  fi
  tar -czf "$OUT/logs.tar.gz" runs/epochs.log runs/profile.log $(ls runs/steps.md "$RUN/results.json" 2>/dev/null)
  rm -rf runs/epochs-head
  if [[ -f $RUN/final/model.safetensors ]]; then
    headstart export "$RUN/final" --format headstart --dtype bfloat16 --output runs/epochs-head -q
    tar -C runs -cf - epochs-head | split -b 15000000 -d -a 1 - "$OUT/heads.tar."
  fi
}

unpack() {
  local files=${1:?the folder holding the files of the call}
  mkdir -p runs/gpu-epochs
  tar -C runs/gpu-epochs -xzf "$files/logs.tar.gz"
  if compgen -G "$files/heads.tar.*" > /dev/null; then
    cat "$files"/heads.tar.* | tar -C runs/gpu-epochs -xf -
  fi
  cp "$files"/profile*.json runs/gpu-epochs/ 2>/dev/null || true
  chmod u+w runs/gpu-epochs/profile*.json 2>/dev/null || true
  # the device's copy of the tree has no git history: the profiles name this checkout's commit
  python3 - "$(git rev-parse --short HEAD)" runs/gpu-epochs/profile*.json <<'PY'
import json, sys
for path in sys.argv[2:]:
    data = json.load(open(path))
    if data.get("commit", "unknown").startswith("unknown"):
        data["commit"] = sys.argv[1] + " (the checkout that made the call)"
        open(path, "w").write(json.dumps(data, indent=2) + "\n")
PY
  ls -la runs/gpu-epochs
}

"$@"
