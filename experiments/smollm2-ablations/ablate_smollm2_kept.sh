#!/bin/bash
# EAGLE-3 option ablations on the embedded SmolLM2 at equal steps, on the committed kept data
# (experiments/smollm2-ablations/train_smollm2_eagle3_ablate_kept.yaml: 300 steps of batch 8 on 600 ShareGPT
# conversations, online, bf16 autocast), each variant one setting away from it, all scored on
# the same 96 held-out turns at 6 draft steps. Run from the repository root, one variant per
# call (each ~10-15 minutes on the 2-core CPU; under the shared lock, so others interleave):
#   for v in base fcnorm qwen3 layers2 vocab16k vocab32k tv kltv mixmath mixall; do
#     flock /tmp/headstart-heavy.lock experiments/smollm2-ablations/ablate_smollm2_kept.sh $v; done
#   python3 experiments/smollm2-ablations/ablation_table.py runs/ablate-kept --output docs/results/scaling/smollm2-eagle3-ablations-kept-cpu.json
# Environment: STEPS (the recipe's 300), TRAIN_ARGS (more overrides for every run, last: they win),
# OUT (default runs/ablate-kept). A finished variant (OUT/NAME/results.json) is skipped.
# Issue 57's screen (each variant ~20-35 min on one thread of the 2-core CPU):
#   PATH=$PWD/.venv/bin:$PATH OMP_NUM_THREADS=1 OUT=runs/ablate-se TQDM_DISABLE=1 taskset -c 1 \
#     experiments/smollm2-ablations/ablate_smollm2_kept.sh VARIANT
# and its 4x-budget check of the adopted recipe against the base (~2-2.5 h each, one per core,
# resumable: `headstart train ... --resume` with the same overrides), then the curves:
#   OUT=runs/ablate-se-4x TRAIN_ARGS="max_steps=1200 eval_every=300 save_every=100 keep_last=1" ... recipe | base
#   .venv/bin/python experiments/smollm2-ablations/curves.py runs/ablate-se-4x --output docs/results/scaling/NAME.png
set -euo pipefail
source "$(dirname "$0")/../keep_aside.sh"
OUT=${OUT:-runs/ablate-kept}
KEPT=data/smollm2-kept
declare -A VARIANTS=(
  [base]=""                                             # the shipped recipe's head: 8k vocab, KL
  [fcnorm]="head.fc_norm=true"                          # EAGLE-3.1: a norm on each tapped state before fc
  [qwen3]="head.draft_layer=qwen3"                      # a Qwen3-style draft layer (q/k norms)
  [layers2]="head.num_layers=2"                         # two draft layers
  [vocab16k]="head.draft_vocab_size=16384"
  [vocab32k]="head.draft_vocab_size=32768"
  [tv]="loss.kl_weight=0 loss.tv_weight=1"              # total variation alone: 1 - TV is the acceptance
  [kltv]="loss.kl_weight=1 loss.tv_weight=1"            # both
  # the data mix at the same 600 conversations: chat + GSM8K; chat + GSM8K + data-free
  [mixmath]="data.path=[$KEPT/sg,$KEPT/gsm8k] data.shares=[0.5,0.5]"
  [mixall]="data.path=[$KEPT/sg,$KEPT/gsm8k,$KEPT/datafree] data.shares=[0.34,0.33,0.33]"
  # sample efficiency (issue "Heads that learn more per token"): the optimizer with its rate swept
  # (base is AdamW at 1e-3), the schedule, the draft layer's start, the TTT weighting and depth,
  # the tapped layers
  [adamw5e4]="optim.lr=5e-4"
  [adamw2e3]="optim.lr=2e-3"
  [adamw4e3]="optim.lr=4e-3"
  [muon]="optim.name=muon"                              # Muon's rate scaled to AdamW's (match_rms_adamw)
  [muon2e3]="optim.name=muon optim.lr=2e-3"
  [muon4e3]="optim.name=muon optim.lr=4e-3"
  [muon8e3]="optim.name=muon optim.lr=8e-3"             # the sweep went on rising at 4e-3
  [muon5e4]="optim.name=muon optim.lr=5e-4"
  [wsd]="optim.schedule=wsd optim.decay=0.2"
  [inittarget]="head.init_layers=target"                # the draft layer starts as target layer 27
  [tttflat]="loss.ttt_decay=1.0"                        # every TTT step weighs the same
  [ttt6]="loss.ttt_steps=6"                             # train as deep as it is scored
  [tapsdeep]="head.feature_layers=[2,15,28]"            # one layer deeper each
  # combinations of the screen's winners
  [muon4e3wsd]="optim.name=muon optim.lr=4e-3 optim.schedule=wsd optim.decay=0.2"
  [muon8e3wsd]="optim.name=muon optim.lr=8e-3 optim.schedule=wsd optim.decay=0.2"
  # issue 57's check: recipes/smollm2-eagle3-cpu.yaml as it stands, only the budget overridden
  [recipe]="batch_size=8 data.path=[$KEPT/sg] data.max_records=600 seed=0 mixed_precision=bf16 loss.eval_ttt_steps=6 max_steps=300 eval_every=300 save_every=300"
)
# the recipe each variant trains: the ablation base, except the check of the shipped CPU recipe
recipe_of() { [[ $1 == recipe ]] && echo recipes/smollm2-eagle3-cpu.yaml || echo experiments/smollm2-ablations/train_smollm2_eagle3_ablate_kept.yaml; }
ORDER=(base fcnorm qwen3 layers2 vocab16k vocab32k tv kltv mixmath mixall
       adamw5e4 adamw2e3 adamw4e3 muon muon2e3 muon4e3 muon8e3 muon5e4 wsd inittarget tttflat ttt6 tapsdeep muon4e3wsd muon8e3wsd recipe)
mkdir -p "$OUT"
for name in "${@:-${ORDER[@]}}"; do
  [[ -v "VARIANTS[$name]" ]] || { echo "unknown variant '$name'; known: ${ORDER[*]}" >&2; exit 2; }
  if [[ -f "$OUT/$name/results.json" ]]; then echo "== $name: done already"; continue; fi
  keep_aside "$OUT/$name"  # a cut run starts over, kept aside
  echo "== $name: ${VARIANTS[$name]:-(the recipe as it is)}"
  # shellcheck disable=SC2086  # the overrides are words on purpose
  headstart train --recipe "$(recipe_of "$name")" output_dir="$OUT/$name" \
    ${STEPS:+max_steps=$STEPS eval_every=$STEPS save_every=$STEPS} ${VARIANTS[$name]} ${TRAIN_ARGS:-} \
    > "$OUT/$name.log" 2>&1 || { echo "$name failed: see $OUT/$name.log" >&2; exit 1; }
  tr "\r" "\n" < "$OUT/$name.log" | grep -o "eval step.*" | tail -1
done
