#!/bin/bash
# Issue 23's data-scaling curve for the embedded SmolLM2: distil every training prompt the repo's
# shared data has (ShareGPT, GSM8K) plus data-free conversations, then train EAGLE-3
# (recipes/train_smollm2_eagle3_scaling.yaml) at three data sizes and keep each run's held-out
# metrics. Meant for a GPU (minutes there; days on a 2-core CPU). Run from the repository root:
#   scripts/scaling_smollm2.sh distill            # every source; resumable, rerun after a cut
#   scripts/scaling_smollm2.sh train 4000 12000 0 # one run per size (0 = all), EPOCHS each
# Environment: DATA (the shared data folder, default ../shared/data), DEVICE (default cuda),
# BATCH (distill rows in flight, default 384), GSM8K (GSM8K records, default all 7473), DATAFREE
# (data-free conversations, default 20000; 0 = none), EPOCHS (default 3), OUT (where each run's
# results.json is copied, default runs/scaling), TRAIN_ARGS (more train overrides).
# The shipped EAGLE-3 heads (recipes/train_smollm2_eagle3_gpu.yaml) came from
#   GSM8K=2304 DATAFREE=0 scripts/scaling_smollm2.sh distill
set -euo pipefail
DATA=${DATA:-../shared/data}
DEVICE=${DEVICE:-cuda}
BATCH=${BATCH:-384}
GSM8K=${GSM8K:-7473}
DATAFREE=${DATAFREE:-20000}
EPOCHS=${EPOCHS:-3}
OUT=${OUT:-runs/scaling}
SG=$DATA/train/sg_90k_part1_html_cleaned_lang_first_sampled_sorted.json
common=(device="$DEVICE" dtype=float32 threads=0 batch_size="$BATCH" cache_features=false)

distill() {
  # held out first (rows 2858-2953 of sg_90k: the shipped heads' held-out set), then the sources
  # in the order the train recipe joins them; data.max_records takes the first N of that order
  headstart distill --recipe recipes/distill_smollm2_shipped_sgeval.yaml "${common[@]}" prompts="$SG" out=runs/scaling/sgeval
  headstart distill --recipe recipes/distill_smollm2_shipped_sg90k.yaml "${common[@]}" prompts="$SG" num=2400 out=runs/scaling/sg
  # num counts records, not rows (prompts over 256 tokens are skipped): 2,400 records end where the
  # shipped recipes' sg1k/sg2k/sg3k did, before the held-out rows; checked here
  python3 -c "from headstart.distill import load_distilled; m = max(load_distilled('runs/scaling/sg')['index']); assert m < 2858, f'row {m} is held out'"
  headstart distill --recipe recipes/distill_smollm2_shipped_sharegpt_v3.yaml "${common[@]}" prompts="$DATA/train/ShareGPT_V3_filtered_1000.json" num=1000 out=runs/scaling/sgv3
  headstart distill --recipe recipes/distill_smollm2_shipped_gsm8k.yaml "${common[@]}" prompts="$DATA/train/gsm8k_train.jsonl" num="$GSM8K" out=runs/scaling/gsm8k
  [[ "$DATAFREE" == 0 ]] || headstart distill --recipe recipes/distill_smollm2_shipped_datafree.yaml "${common[@]}" num="$DATAFREE" datafree.batch_size="$BATCH" out=runs/scaling/datafree
}

train() {
  # DEADLINE (epoch seconds, optional): fewer steps when EPOCHS would not end before it, at the
  # seconds per step of the run before (the first run is never shortened); results.json says how
  # many steps each size got
  local size records steps last="" name sources=()
  for name in sg sgv3 gsm8k datafree; do  # the sources distill wrote, in its order
    [[ -f "runs/scaling/$name/distill_meta.json" ]] && sources+=("runs/scaling/$name")
  done
  local paths
  paths="data.path=[$(IFS=,; echo "${sources[*]}")]"
  for size in "$@"; do
    records=$(python3 -c "
import sys
from headstart.distill import load_distilled
n = sum(len(load_distilled(p)) for p in sys.argv[2:])
print(min(n, int(sys.argv[1])) if int(sys.argv[1]) else n)" "$size" "${sources[@]}")
    steps=$(( (records * EPOCHS + 31) / 32 ))
    if [[ -n "${DEADLINE:-}" && -n "$last" ]]; then
      steps=$(python3 -c "
import json, sys, time
r = json.load(open(sys.argv[1]))
fit = int((float(sys.argv[3]) - time.time() - 60) / (r['wall_s'] / r['steps']))
print(min(int(sys.argv[2]), max(50, fit)))" "$last" "$steps" "$DEADLINE")
    fi
    echo "== size $size: $records conversations, $steps steps ($EPOCHS epochs = $(( (records * EPOCHS + 31) / 32 )))"
    headstart train --recipe recipes/train_smollm2_eagle3_scaling.yaml "$paths" data.max_records="$size" \
      max_steps="$steps" eval_every="$(( steps / 3 > 0 ? steps / 3 : 1 ))" output_dir="runs/scaling/eagle3-$records" ${TRAIN_ARGS:-}
    mkdir -p "$OUT"
    last="runs/scaling/eagle3-$records/results.json"
    cp "$last" "$OUT/results-$records.json"
  done
}

"$@"
