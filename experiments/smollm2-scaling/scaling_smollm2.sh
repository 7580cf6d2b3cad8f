#!/bin/bash
# Issue 23's data-scaling curve for the embedded SmolLM2: distil every training prompt the repo's
# shared data has (ShareGPT, GSM8K) plus data-free conversations, then train EAGLE-3
# (experiments/smollm2-scaling/train_smollm2_eagle3_scaling.yaml) at three data sizes and keep each run's held-out
# metrics. Meant for a GPU (minutes there; days on a 2-core CPU). Run from the repository root:
#   experiments/smollm2-scaling/scaling_smollm2.sh distill                   # every source; resumable, rerun after a cut
#   experiments/smollm2-scaling/scaling_smollm2.sh distill datafree          # some sources only (sgeval sg sgv3 gsm8k datafree)
#   STEPS=2000 PARALLEL=1 experiments/smollm2-scaling/scaling_smollm2.sh train 4000 12000 0   # one run per size (0 = all)
# Environment: DATA (the shared data folder, default ../shared/data), DEVICE (default cuda),
# BATCH (distill rows in flight, default 1024: on an H100 it beat 384 and 2048), GSM8K (GSM8K
# records, default all 7473), DATAFREE (data-free conversations, default 20000; 0 = none), SG_NUM
# and SGV3_NUM (ShareGPT records, default 2400 and 1000), TARGET (default smollm2: the staged GGUF
# on a bare GPU machine), STEPS
# (the same optimizer steps for every size: equal compute) or EPOCHS (default 3: equal epochs),
# PARALLEL=1 (train the sizes at once: one small head leaves most of a GPU idle), OUT (where each
# run's results.json is copied, default runs/scaling), TRAIN_ARGS (more train overrides), SRC (the
# distilled sources' folder, default runs/scaling; data/smollm2-kept is the committed kept set),
# BUDGET (seconds: each run stops cleanly before it, a checkpoint kept), RESUME=1 (continue
# each run from its newest checkpoint: budgeted runs in pieces give the run of one piece), FINISH=1
# (a run the budget stopped writes its head from that checkpoint) and DFLASH_LAYERS (see train).
# Every size takes the same share of each source (data.max_records_from=each), so the sizes nest
# and keep one mix of chat, math and data-free conversations.
# The shipped EAGLE-3 heads (experiments/smollm2-shipped/train_smollm2_eagle3_gpu.yaml) came from
#   GSM8K=2304 DATAFREE=0 experiments/smollm2-scaling/scaling_smollm2.sh distill
set -euo pipefail
DATA=${DATA:-../shared/data}
DEVICE=${DEVICE:-cuda}
BATCH=${BATCH:-1024}
GSM8K=${GSM8K:-7473}
DATAFREE=${DATAFREE:-20000}
EPOCHS=${EPOCHS:-3}
OUT=${OUT:-runs/scaling}
SRC=${SRC:-runs/scaling}
SG=$DATA/train/sg_90k_part1_html_cleaned_lang_first_sampled_sorted.json
TARGET=${TARGET:-smollm2}
SGEVAL_NUM=${SGEVAL_NUM:-96}
SG_NUM=${SG_NUM:-2400}
SGV3_NUM=${SGV3_NUM:-1000}
common=(target="$TARGET" device="$DEVICE" dtype=float32 threads=0 batch_size="$BATCH" cache_features=false)

distill() {
  local source
  for source in "${@:-sgeval sg sgv3 gsm8k datafree}"; do
    for one in $source; do "distill_$one"; done
  done
}
# held out first (rows 2858-2953 of sg_90k: the shipped heads' held-out set), then the sources in
# the order the train recipe joins them
distill_sgeval() {
  headstart distill --recipe experiments/smollm2-shipped/distill_smollm2_shipped_sgeval.yaml "${common[@]}" prompts="$SG" num="$SGEVAL_NUM" out=runs/scaling/sgeval
}
distill_sg() {
  headstart distill --recipe experiments/smollm2-shipped/distill_smollm2_shipped_sg90k.yaml "${common[@]}" prompts="$SG" num="$SG_NUM" out=runs/scaling/sg
  # num counts records, not rows (prompts over 256 tokens are skipped): 2,400 records end where the
  # shipped recipes' sg1k/sg2k/sg3k did, before the held-out rows; checked here
  python3 -c "from headstart.distill import load_distilled; m = max(load_distilled('runs/scaling/sg')['index']); assert m < 2858, f'row {m} is held out'"
}
distill_sgv3() {
  headstart distill --recipe experiments/smollm2-shipped/distill_smollm2_shipped_sharegpt_v3.yaml "${common[@]}" prompts="$DATA/train/ShareGPT_V3_filtered_1000.json" num="$SGV3_NUM" out=runs/scaling/sgv3
}
distill_gsm8k() {
  headstart distill --recipe experiments/smollm2-shipped/distill_smollm2_shipped_gsm8k.yaml "${common[@]}" prompts="$DATA/train/gsm8k_train.jsonl" num="$GSM8K" out=runs/scaling/gsm8k
}
distill_datafree() {
  [[ "$DATAFREE" == 0 ]] || headstart distill --recipe experiments/smollm2-shipped/distill_smollm2_shipped_datafree.yaml "${common[@]}" num="$DATAFREE" datafree.batch_size="$BATCH" out=runs/scaling/datafree
}

keep_results() {  # a run stopped by BUDGET writes no results.json (its checkpoint and log say where it is)
  local results="runs/scaling/$1/results.json"
  [[ ! -f "$results" ]] || cp "$results" "$OUT/results-${1#eagle3-}.json"
}

finish() {  # NAME COMMAND...: keep the run's results; with FINISH=1 a run BUDGET stopped writes its
  # head and final held-out figures from its newest checkpoint (the same command, --resume,
  # max_steps = the steps it made; its cosine schedule was cut short, which its results say)
  local name=$1 last
  shift
  if [[ ! -f "runs/scaling/$name/results.json" && "${FINISH:-0}" == 1 ]]; then
    last=$(ls -d "runs/scaling/$name"/checkpoints/step-* 2>/dev/null | tail -n 1 || true)  # none: nothing to finish
    if [[ -n "$last" ]]; then
      echo "== $name: finishing from $(basename "$last")"
      "$1" "$2" --resume "${@:3}" max_steps="$((10#${last##*step-}))" time_budget_s=0 || return 1
    fi
  fi
  keep_results "$name"
}

launch() {  # NAME RECIPE STEPS OVERRIDES...: one run, alone or (PARALLEL=1) in the background
  local name=$1 recipe=$2 steps=$3 run
  shift 3
  # a resumed run's results are written again (an earlier call may have finished it early)
  [[ "${RESUME:-0}" != 1 ]] || rm -f "runs/scaling/$name/results.json"
  # a checkpoint every quarter: a run cut by a deadline (SIGTERM) keeps its steps for --resume
  run=(headstart train "${flags[@]}" --recipe "$recipe" target="$TARGET" "$paths" "data.eval_path=[$SRC/sgeval]" max_steps="$steps"
       eval_every="$(( steps / 4 > 0 ? steps / 4 : 1 ))" save_every="$(( steps / 4 > 0 ? steps / 4 : 1 ))"
       output_dir="runs/scaling/$name" "${more[@]}" ${TRAIN_ARGS:-} "$@")
  if [[ "${PARALLEL:-0}" == 1 ]]; then
    ("${run[@]}" >> "runs/scaling/$name.log" 2>&1 && finish "$name" "${run[@]}" >> "runs/scaling/$name.log" 2>&1) &
    pids+=($!)
  else
    "${run[@]}" 2>&1 | tee -a "runs/scaling/$name.log"
    finish "$name" "${run[@]}" 2>&1 | tee -a "runs/scaling/$name.log"
  fi
}

count_records() {  # SIZE SOURCE...: conversations a run of that size trains on (0 = all of them)
  python3 -c "
import sys
from headstart.distill import load_distilled
n = sum(len(load_distilled(p)) for p in sys.argv[2:])
print(min(n, int(sys.argv[1])) if int(sys.argv[1]) else n)" "$@"
}

train() {  # SIZE...: EAGLE-3 at each data size (0 = all); DFLASH_LAYERS="1 2" adds DFlash runs on all
  # the data (recipes/smollm2-dflash-gpu.yaml, that many layers) beside them, at STEPS (else
  # EPOCHS over all the data): with SIZES=0, equal data, steps and wall time for issue 35
  local size records steps name sources=() pids=() failed=0 layers
  for name in sg sgv3 gsm8k datafree; do  # the sources distill wrote, in its order
    [[ -f "$SRC/$name/distill_meta.json" ]] && sources+=("$SRC/$name")
  done
  local paths more=() flags=()
  paths="data.path=[$(IFS=,; echo "${sources[*]}")]"
  [[ -n "${BUDGET:-}" ]] && more+=(time_budget_s="$BUDGET")
  [[ "${RESUME:-0}" == 1 ]] && flags+=(--resume)  # before the overrides: argparse takes no flag after them
  mkdir -p runs/scaling "$OUT"
  for size in "$@"; do
    records=$(count_records "$size" "${sources[@]}")
    steps=${STEPS:-$(( (records * EPOCHS + 31) / 32 ))}
    echo "== size $size: $records conversations, $steps steps ($(python3 -c "print(round($steps * 32 / $records, 1))") epochs)"
    launch "eagle3-$records" experiments/smollm2-scaling/train_smollm2_eagle3_scaling.yaml "$steps" \
      data.max_records="$records" data.max_records_from=each loss.eval_ttt_steps=6
  done
  [[ -z "${DFLASH_LAYERS:-}" ]] || records=$(count_records 0 "${sources[@]}")  # DFlash: all the data
  steps=${STEPS:-$(( (${records:-0} * EPOCHS + 31) / 32 ))}
  for layers in ${DFLASH_LAYERS:-}; do
    echo "== DFlash, $layers layer(s): $records conversations, $steps steps"
    launch "dflash-l$layers" recipes/smollm2-dflash-gpu.yaml "$steps" head.num_layers="$layers" \
      data.max_records="$records" data.max_records_from=each
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done  # a failed run fails the script (its log says why)
  return $failed
}

"$@"
