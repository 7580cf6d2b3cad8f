#!/bin/bash
# DFlash against EAGLE-3 on the embedded SmolLM2, at equal data and equal training tokens (the same
# 300 steps of 8 conversations, the same order), scored on the same held-out set at the same 6
# draft steps (DFlash depth j = block slot j+1). Run from the repository root, one run after another:
#   experiments/dflash-vs-eagle3/dflash_vs_eagle3.sh                      # every variant below
#   experiments/dflash-vs-eagle3/dflash_vs_eagle3.sh eagle3 l2            # some of them
#   python3 experiments/smollm2-ablations/ablation_table.py runs/dflash    # the table (markdown + JSON)
# Environment: TRAIN_ARGS (overrides for every run, e.g. data.path=[DIR] data.eval_path=[DIR]), OUT
# (default runs/dflash). A finished variant (OUT/NAME/results.json) is skipped: rerun after a cut.
# Data (CPU, ~11 min each): see the header of experiments/dflash-vs-eagle3/train_smollm2_dflash_cpu.yaml.
set -euo pipefail
source "$(dirname "$0")/../keep_aside.sh"
OUT=${OUT:-runs/dflash}
declare -A VARIANTS=(
  [eagle3]="eagle3"                           # the EAGLE-3 ablation base (4 TTT steps, vocab 8,192)
  [l1]="head.num_layers=1"                    # DFlash draft layers: the default is chosen from these
  [l2]="head.num_layers=2"
  [l3]="head.num_layers=3"
  [l2b8]="head.num_layers=2 head.block_size=8"   # a shorter block
  [l2hard]="head.num_layers=2 loss.dflash_labels=hard"   # the data's tokens, z-lab's labels
  [l2a64]="head.num_layers=2 loss.dflash_anchors=64"     # more blocks a conversation
  [l1warm]="head.num_layers=1 head.init_layers=target"   # the draft layer starts as the target's
  [l2warm]="head.num_layers=2 head.init_layers=target"
)
ORDER=(eagle3 l1 l2 l3 l2b8 l2hard l2a64 l1warm l2warm)
mkdir -p "$OUT"
for name in "${@:-${ORDER[@]}}"; do
  [[ -v "VARIANTS[$name]" ]] || { echo "unknown variant '$name'; known: ${ORDER[*]}" >&2; exit 2; }
  if [[ -f "$OUT/$name/results.json" ]]; then echo "== $name: done already"; continue; fi
  keep_aside "$OUT/$name"  # a cut run starts over, kept aside
  recipe=experiments/dflash-vs-eagle3/train_smollm2_dflash_cpu.yaml
  overrides=${VARIANTS[$name]}
  if [[ $overrides == eagle3 ]]; then recipe=experiments/smollm2-ablations/train_smollm2_eagle3_ablate.yaml; overrides=""; fi
  echo "== $name: ${overrides:-(the recipe as it is)}"
  # shellcheck disable=SC2086  # the overrides are words on purpose
  headstart train --recipe "$recipe" output_dir="$OUT/$name" $overrides ${TRAIN_ARGS:-} \
    > "$OUT/$name.log" 2>&1 || { echo "$name failed: see $OUT/$name.log" >&2; exit 1; }
  tr "\r" "\n" < "$OUT/$name.log" | grep -o "eval step.*" | tail -1  # progress bars end in \r
done
