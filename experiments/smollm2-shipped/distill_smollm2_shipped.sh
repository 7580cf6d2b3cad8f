#!/bin/bash
# The data of the shipped SmolLM2 heads (experiments/smollm2-shipped/train_smollm2_eagle3_shipped.yaml): every distill
# recipe in order, 2 threads, through the continuous-batching engine (about an hour on a 2-core
# CPU; resumable: rerun after an interruption). Run from the repository root, with ../shared/data.
set -euo pipefail
for spec in "sgeval" "sg90k" "gsm8k num=48" "sg90k_more" "sg90k_stage3" "sharegpt_v3" "gsm8k_stage4" "datafree"; do
  set -- $spec
  name=$1
  shift
  echo "== distill_smollm2_shipped_$name $*"
  headstart distill --recipe "experiments/smollm2-shipped/distill_smollm2_shipped_$name.yaml" threads=2 batch_size=64 "$@"
done
