#!/bin/bash
# The data-scaling curve on one GPU, from the committed kept dataset (data/smollm2-kept:
# nothing to distill first): EAGLE-3 heads for SmolLM2 at three data sizes at equal steps, trained
# in parallel (one small head leaves most of a GPU idle) under a time budget, each evaluated on
# the 96 held-out ShareGPT first turns every quarter; the logs, results and finished heads (bf16)
# come back as at most 7 files of 15 MB.
#
#   scripts/gpu/stage.sh                     # here: .gpu/ (wheels, GGUF parts)
#   device calls 1-3 of gpu/stage.sh (they stage GGUF parts 1-3), then the fourth:
#     carry [".gpu/wheels", ".gpu/smollm2.part4", ".gpu/smollm2.sha256"]
#     scripts/gpu/train.sh device            # (timeout_s 600; BUDGET=400 s of training)
#   a fourth on the same warm machine (runs/ and the staged GGUF are still there), if device time
#   is left: RESUME=1 BUDGET=<seconds> scripts/gpu/train.sh device
#   scripts/gpu/train.sh unpack FILES_DIR    # here: runs/gpu-scaling (logs, results, heads)
#   .venv/bin/python scripts/plot_scaling.py --output docs/results/scaling/smollm2-eagle3-kept-gpu \
#     runs/gpu-scaling/results-*.json       # the table, numbers and PNG (checked on the dry run)
#
# The GPU comparison, DFlash against EAGLE-3 at equal data, steps and wall time (three runs
# side by side on every kept conversation), as the fourth call (timeout_s 600: its smoke ~40 s,
# the budget, the finishing and the collection ~100 s):
#   SIZES=0 DFLASH_LAYERS="1 2" STEPS=900 BUDGET=400 scripts/gpu/train.sh device
# and here, after the unpack (a run finished from its checkpoint reports 0 train tok/s in its
# results: its training figures are the log's "stopped" summary):
#   .venv/bin/python scripts/plot_scaling.py --x epochs --title "DFlash against EAGLE-3 on SmolLM2-135M" \
#     --output docs/results/scaling/smollm2-dflash-vs-eagle3-gpu runs/gpu-scaling/results-*.json
# (Done 2026-11-27 on an H100: docs/results/scaling/smollm2-dflash-vs-eagle3-gpu.md. EAGLE-3 won; none of
# these 900-step heads beat the shipped ones, 2,500 steps on chat and math.)
# A longer EAGLE-3 on the kept chat and math only (10,520 conversations; dry-run on the CPU: the
# later data.path wins), alone, in two calls on one warm machine (~3.5 steps a second alone on an H100):
#   SIZES=0 STEPS=1800 BUDGET=400 TRAIN_ARGS="data.path=[data/smollm2-kept/sg,data/smollm2-kept/sgv3,data/smollm2-kept/gsm8k]" scripts/gpu/train.sh device
#   then the same with RESUME=1 BUDGET=150 CALL_S=320 SMOKE=0 (timeout_s 255; its run is still named
#   eagle3-30520: the count is of every source). 364 + 150 s of training fit one lease: ~1,800 steps
# SIZES (default "5000 15000 0": 0 = every kept conversation), DFLASH_LAYERS (DFlash runs of that
# many layers on all the data, beside them), FINISH (default 1: a run the budget stopped still
# writes its head from its newest checkpoint, so every run returns one), STEPS (default 1000, equal steps:
# on an H100 (2026-11-25) the smallest of three parallel runs made 2,000 steps in 430 s and the
# larger two went slower (1,108 and 855 steps when that machine was lost; their start-up counted
# tokens in 2x22k tiny threaded ops, fixed since), so 1,000 should fit one
# call; for equal epochs: STEPS= EPOCHS=3), BUDGET (seconds of training per call), RESUME=1.
# A run stopped by the budget keeps a checkpoint in runs/scaling/eagle3-N/checkpoints (on the
# machine, while it stays warm) and its held-out evaluations so far in its log.
# Dry run on a CPU (tiny sizes, two budgeted pieces):
#   DEVICE=cpu SIZES="40 80" STEPS=6 BUDGET=60 OUT=/tmp/gt STAGE=/tmp/stage scripts/gpu/train.sh device
#   RESUME=1 DEVICE=cpu SIZES="40 80" STEPS=6 BUDGET=600 OUT=/tmp/gt STAGE=/tmp/stage scripts/gpu/train.sh device
set -euo pipefail
OUT=${OUT:-runs/train-out}
BUDGET=${BUDGET:-400}
SIZES=${SIZES-5000 15000 0}
DFLASH_LAYERS=${DFLASH_LAYERS:-}
source "$(dirname "$0")/common.sh"

CALL_S=${CALL_S:-590}  # the device call's limit (timeout_s 600), less a margin: $OUT must be written by then

device() {
  mkdir -p "$OUT" runs  # runs/ is git-ignored: a fresh machine has none
  if [[ "${RESUME:-0}" != 1 && -d runs/scaling ]]; then
    # a warm machine's earlier call: its runs would be retrained (and refused) or collected as this one's
    mv runs/scaling "runs/scaling.before-$(date +%s)"
  fi
  gpu_prepare
  local start=$SECONDS code=0 watchdog
  smoke || { collect; return 1; }
  # the budget shrinks by what start-up and the smoke overran: the watchdog's kill (+103 s: every
  # `headstart train` is gone by then, so the backstop's shell ends at once) and the collection
  # (~40 s) must still end inside the call
  local fits=$(( CALL_S - SECONDS - 150 ))
  if (( BUDGET > fits )); then
    echo "budget: $BUDGET s does not fit the call after $SECONDS s of start-up; training for $fits s"
    BUDGET=$fits
  fi
  (( BUDGET >= 60 )) || { echo "budget: no time left to train ($BUDGET s)"; collect; return 1; }
  # past the budget and the finishing, the runs still alive print their stacks before the backstop
  watch_then_stop "$((BUDGET + 80))" runs
  watchdog=$!
  # the budget ends each run cleanly (checkpoint, then exit); the timeout is only a backstop.
  # CPU threads split between the runs: each would start one per core (16), and a process's tiny
  # CPU ops (collate, start-up loops) slow down many-fold when 48 threads share 16 cores
  local runs
  runs=$(( $(wc -w <<< "$SIZES $DFLASH_LAYERS") ))
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / (runs > 0 ? runs : 1) > 0 ? $(nproc) / (runs > 0 ? runs : 1) : 1 ))}
  echo "runs: $runs side by side, OMP_NUM_THREADS=$OMP_NUM_THREADS each"
  OUT=runs/scaling SRC=data/smollm2-kept TARGET="$STAGE/smollm2.gguf" STEPS=${STEPS-1000} PARALLEL=1 BUDGET="$BUDGET" \
    RESUME="${RESUME:-0}" FINISH="${FINISH:-1}" DFLASH_LAYERS="$DFLASH_LAYERS" TRAIN_ARGS="${TRAIN_ARGS:-}" \
    timeout -s TERM -k 30 "$((BUDGET + 100))" \
    experiments/smollm2-scaling/scaling_smollm2.sh train $SIZES || code=$?
  kill "$watchdog" 2>/dev/null || true
  settle 'headstart train'  # a checkpoint or final head being written when the backstop came
  echo "train: exit $code after $((SECONDS - start)) s"
  collect
}

smoke() {  # one process, two steps on 64 conversations, 120 s at most: a start-up that hangs on this
  # machine (2026-11-26, H200: three runs sat silent after loading the target until the timeout)
  # costs two minutes, not the call, and its log says where it stood
  [[ "${SMOKE:-1}" == 1 ]] || return 0
  rm -rf runs/smoke
  mkdir -p runs
  local pid code=0
  headstart train --recipe experiments/smollm2-scaling/train_smollm2_eagle3_scaling.yaml target="$STAGE/smollm2.gguf" \
    "data.path=[data/smollm2-kept/sg]" "data.eval_path=[data/smollm2-kept/sgeval]" data.max_records=64 \
    max_steps=2 eval_every=2 save_every=2 output_dir=runs/smoke > runs/smoke.log 2>&1 &
  pid=$!
  watch_then_stop 120 "$pid"
  local watchdog=$!
  wait "$pid" || code=$?
  kill "$watchdog" 2>/dev/null || true
  if [[ $code == 0 ]]; then
    echo "smoke: two steps in one process, $(grep -o 'start-up took [0-9.]* s' runs/smoke.log)"
  else
    echo "smoke: failed (exit $code); the runs are skipped"; tr '\r' '\n' < runs/smoke.log | grep -v '^$' | tail -n 40
    cp runs/smoke.log "$OUT/"
    return 1
  fi
}

watch_then_stop() {  # SECONDS PID|runs: in the background, after SECONDS, stacks_then_stop that process (runs:
  # every `headstart train` still alive). Killing the watcher (TERM) kills its sleep too, and it
  # holds none of the script's output open: a later call on the same warm machine is never hit.
  (
    trap 'kill "$nap" 2>/dev/null; exit 0' TERM
    sleep "$1" & nap=$!
    wait "$nap"
    if [[ "$2" == runs ]]; then stacks_then_stop $(pgrep -f 'headstart train' || true); else stacks_then_stop "$2"; fi
  ) </dev/null >/dev/null 2>&1 &
}

stacks_then_stop() {  # PID...: every thread's stack into the run's log (headstart's SIGUSR1), then
  # SIGTERM (a checkpoint where there are steps), then SIGKILL: a hang says where it was
  kill -USR1 "$@" 2>/dev/null || return 0
  sleep 3
  kill -TERM "$@" 2>/dev/null || return 0
  sleep 20
  kill -KILL "$@" 2>/dev/null || true
}

collect() {  # logs and results in one file; each finished head as bf16, split into 15 MB parts
  local run
  mkdir -p runs/scaling
  grep -H -E 'loaded on|conversations read|start-up took|interrupted|eval step|time budget|finishing|^ *"(steps|tokens_per_s|wall_s)"|error' \
    runs/scaling/*.log || true
  local logs
  logs=$(cd runs/scaling && ls -d ./*.log results-*.json 2>/dev/null || true)
  if [[ -n "$logs" ]]; then
    tar -C runs/scaling -czf "$OUT/logs.tar.gz" $logs
  else
    cp runs/smoke.log "$OUT/" 2>/dev/null || true  # nothing ran: the smoke's log says why
  fi
  rm -rf runs/train-heads && mkdir -p runs/train-heads  # only this call's heads
  for run in runs/scaling/eagle3-*/ runs/scaling/dflash-*/; do
    run=${run%/}
    [[ -f "$run/final/model.safetensors" ]] || continue
    headstart export "$run/final" --format headstart --dtype bfloat16 --overwrite \
      --output "runs/train-heads/$(basename "$run")" -q
  done
  if compgen -G "runs/train-heads/*" > /dev/null; then
    tar -C runs/train-heads -cf - . | split -b 15000000 -d -a 1 - "$OUT/heads.tar."
  fi
  ls -la "$OUT"
  local parts
  parts=$(find "$OUT" -type f | wc -l)
  (( parts <= 8 )) || echo "warning: $parts files in $OUT; a call returns 8 at most"
}

unpack() {
  local files=${1:?the folder holding logs.tar.gz and heads.tar.N}
  mkdir -p runs/gpu-scaling
  tar -C runs/gpu-scaling -xzf "$files/logs.tar.gz"
  if compgen -G "$files/heads.tar.*" > /dev/null; then
    cat "$files"/heads.tar.* | tar -C runs/gpu-scaling -xf -
  fi
  ls -la runs/gpu-scaling
}

"$@"
