#!/bin/bash
# Training throughput of EAGLE-3 against an older commit, measured in one run: the same recipe
# (offline features, batch 8, max length 384, no held-out eval) runs alternately from a git
# worktree of BASE and from this checkout, ROUNDS times each, and train tokens/s are printed.
#   scripts/bench_train.sh 0e23d4e                 # the code before the training-speed work of 2026-11-24
#   THREADS=2 ROUNDS=3 scripts/bench_train.sh HEAD~1
# Environment: DATA (a distill directory with cached features, default runs/distill-smollm2-sg600;
# see experiments/smollm2-ablations/train_smollm2_eagle3_ablate.yaml for the command that makes it), STEPS (16),
# THREADS (1), ROUNDS (2), LAYOUT (fc, default, or reference: the EAGLE-3 layout of both sides;
# commits before c44e3e0 know fc only), NEW_ARGS (recipe overrides for this checkout's runs only, e.g.
# "optim.freeze=[lm_head]": what a recipe change buys on top of the code).
set -euo pipefail
BASE=${1:?usage: scripts/bench_train.sh BASE_COMMIT}
DATA=$(realpath "${DATA:-runs/distill-smollm2-sg600}")
HERE=$(pwd)
WORK=$(mktemp -d)
trap 'git -C "$HERE" worktree remove --force "$WORK/base" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
git worktree add --detach "$WORK/base" "$BASE" >/dev/null 2>&1
cat > "$WORK/recipe.yaml" <<YAML
target: smollm2
dtype: float32
output_dir: $WORK/out
head: {kind: eagle3, draft_vocab_size: 8192}
data: {path: [$DATA], mode: offline, holdout: 0, max_length: 384}
optim: {lr: 0.001, warmup_steps: 5, schedule: cosine, max_grad_norm: 0.5}
loss: {ttt_steps: 4, ttt_decay: 0.8}
batch_size: 8
max_steps: ${STEPS:-16}
eval_every: 1000
save_every: 1000
log_every: 4
seed: 0
trackers: []
YAML
for round in $(seq "${ROUNDS:-2}"); do
  for side in base new; do
    tree=$HERE; [[ $side == base ]] && tree=$WORK/base
    # the recipe leaves the layout out: commits before c44e3e0 do not know the key (fc is theirs)
    layout=(head.layout="${LAYOUT:-fc}")
    if [[ $side == base ]] && ! git -C "$tree" merge-base --is-ancestor c44e3e0 HEAD 2>/dev/null; then
      [[ ${LAYOUT:-fc} == fc ]] || { echo "$BASE knows the fc layout only: LAYOUT=fc"; exit 2; }
      layout=()
    fi
    extra=()
    # shellcheck disable=SC2206  # the overrides are words on purpose
    [[ $side == new ]] && extra=(${NEW_ARGS:-})
    rm -rf "$WORK/out"
    (cd "$tree" && OMP_NUM_THREADS=${THREADS:-1} PYTHONPATH=$tree "$HERE/.venv/bin/python" -m headstart train \
       --recipe "$WORK/recipe.yaml" "${layout[@]}" "${extra[@]}" > "$WORK/$side.log" 2>&1) \
      || { echo "$side failed:"; tail -5 "$WORK/$side.log"; exit 1; }
    label=$([[ $side == base ]] && echo "base $BASE" || echo "this checkout")
    python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(f'round $round, $label, ${THREADS:-1} thread(s): {d[\"tokens_per_s\"]} train tok/s, {d[\"steps\"]} steps in {d[\"wall_s\"]} s')" "$WORK/out/results.json"
  done
done
