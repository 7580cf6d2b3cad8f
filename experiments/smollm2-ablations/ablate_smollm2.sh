#!/bin/bash
# Issue 23's recipe ablations for EAGLE-3 on the embedded SmolLM2: each variant changes one setting
# of experiments/smollm2-ablations/train_smollm2_eagle3_ablate.yaml (training-time-test depth, per-step loss weights,
# draft vocabulary size, a frozen draft lm_head), trains the same steps on the same data, and is scored on the same
# held-out set at the same depth. Run from the repository root, one run after another:
#   experiments/smollm2-ablations/ablate_smollm2.sh                       # every variant below
#   experiments/smollm2-ablations/ablate_smollm2.sh base ttt1 vocab16k    # some of them
#   python3 experiments/smollm2-ablations/ablation_table.py runs/ablate   # the table (markdown + JSON)
# Environment: STEPS (default: the recipe's 300, 4 epochs of 600 conversations), TRAIN_ARGS (more overrides for every run, e.g.
# data.path=[...] data.mode=online batch_size=32 mixed_precision=bf16 on a GPU),
# OUT (default runs/ablate). A finished variant (OUT/NAME/results.json) is skipped: rerun after a cut.
# Feature-layer choice is not a variant here: offline features hold the layers distill cached.
# data1200 needs 600 more conversations (rows 1,392 on of sg_90k, before the held-out rows):
#   headstart distill --recipe experiments/smollm2-shipped/distill_smollm2_shipped_sg90k_more.yaml num=600 threads=2 out=runs/distill-smollm2-sgmore600
set -euo pipefail
source "$(dirname "$0")/../keep_aside.sh"
OUT=${OUT:-runs/ablate}
declare -A VARIANTS=(
  [base]=""                                   # EAGLE-3's reference: 4 steps, weights 0.8^j
  [ttt1]="loss.ttt_steps=1"                   # no training-time test (EAGLE-2-style training)
  [ttt2]="loss.ttt_steps=2"
  [ttt7]="loss.ttt_steps=7"                   # the EAGLE-3 release's depth
  [decay1]="loss.ttt_decay=1.0"               # every step weighs the same
  [decay0.6]="loss.ttt_decay=0.6"
  [vocab4k]="head.draft_vocab_size=4096"
  [vocab16k]="head.draft_vocab_size=16384"
  [vocab32k]="head.draft_vocab_size=32000"    # the EAGLE-3 release's size (Llama 3: 128k -> 32k)
  [lmfrozen]="optim.freeze=[lm_head]"         # the draft lm_head stays the target's rows (cheaper step)
  # data size at equal steps (a small data-scaling curve; base is 600): the first N conversations
  [data150]="data.max_records=150"
  [data300]="data.max_records=300"
  [data1200]="data.path=[runs/distill-smollm2-sg600,runs/distill-smollm2-sgmore600]"  # + 600 more
  # the same two sources in the same shares at smaller sizes (the 600 more have shorter prompts)
  [data300mix]="data.path=[runs/distill-smollm2-sg600,runs/distill-smollm2-sgmore600] data.max_records=300 data.max_records_from=each"
  [data600mix]="data.path=[runs/distill-smollm2-sg600,runs/distill-smollm2-sgmore600] data.max_records=600 data.max_records_from=each"
)
ORDER=(base ttt1 decay1 vocab16k ttt7 vocab4k ttt2 decay0.6 vocab32k lmfrozen data150 data300 data1200
       data300mix data600mix)
mkdir -p "$OUT"
for name in "${@:-${ORDER[@]}}"; do
  [[ -v "VARIANTS[$name]" ]] || { echo "unknown variant '$name'; known: ${ORDER[*]}" >&2; exit 2; }
  if [[ -f "$OUT/$name/results.json" ]]; then echo "== $name: done already"; continue; fi
  keep_aside "$OUT/$name"  # a cut run starts over, kept aside
  echo "== $name: ${VARIANTS[$name]:-(the recipe as it is)}"
  # shellcheck disable=SC2086  # the overrides are words on purpose
  headstart train --recipe experiments/smollm2-ablations/train_smollm2_eagle3_ablate.yaml output_dir="$OUT/$name" \
    ${STEPS:+max_steps=$STEPS eval_every=$STEPS save_every=$STEPS} ${VARIANTS[$name]} ${TRAIN_ARGS:-} \
    > "$OUT/$name.log" 2>&1 || { echo "$name failed: see $OUT/$name.log" >&2; exit 1; }
  tr "\r" "\n" < "$OUT/$name.log" | grep -o "eval step.*" | tail -1  # progress bars end in \r
done
