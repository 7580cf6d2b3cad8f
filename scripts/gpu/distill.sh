#!/bin/bash
# The kept dataset (data/smollm2-kept, see its README): the embedded SmolLM2's own replies
# to ~30,600 conversations (96 held-out + 2,400 sg_90k + 647 ShareGPT_V3 first turns, 7,473 GSM8K,
# 20,000 data-free), distilled on one GPU (experiments/smollm2-scaling/scaling_smollm2.sh distill, batch 1024, greedy,
# 256-token prompts, 128-token replies: the mix of the scaling runs), brought back as at most
# 5 files of 15 MB (xz-compressed shards), then packed here for `headstart train`.
#
#   scripts/gpu/stage.sh                     # here: .gpu/ (wheels, GGUF parts); then also
#   scripts/gpu/distill.sh stage             # here: .gpu/data (the prompt files, gzipped: 2.2 MB)
#   device calls 1-3 of gpu/stage.sh (they stage GGUF parts 1-3), then the fourth:
#     carry [".gpu/wheels", ".gpu/data", ".gpu/smollm2.part4", ".gpu/smollm2.sha256"] (~59 MiB in all)
#     scripts/gpu/distill.sh device          # (timeout_s 600; DEADLINE=480 s of distilling)
#   scripts/gpu/distill.sh unpack FILES_DIR  # here: data/smollm2-kept/<source>, packed
#
# The distill is cut cleanly at DEADLINE (SIGTERM keeps every finished record); a later call on
# the same warm machine resumes it (runs/ stays there), a call on a fresh one starts over. On the
# H200 (2026-11-26) sg took 46 s, GSM8K 108 s and data-free ~18 s per 1,000: the whole set needs
# about 9.5 minutes, so set DEADLINE to what the call has and resume the rest in a second call.
# Dry run on a CPU: DEVICE=cpu BATCH=8 SGEVAL_NUM=2 SG_NUM=2 SGV3_NUM=2 GSM8K=2 DATAFREE=2 \
#   OUT=/tmp/gd STAGE=/tmp/stage scripts/gpu/distill.sh device
# Long and multi-turn data (issue 69), after `stage`: scripts/gpu/distill.sh device_long (DEADLINE,
# LONG_SOURCES, LONG_BATCH), then here scripts/gpu/distill.sh unpack_long FILES_DIR. Its CPU dry
# run (the embedded target, no staged GGUF): DEVICE=cpu THREADS=1 LONG_BATCH=2 NUM_SGLONG=2 NUM_SGFOLLOW=1 \
#   FOLLOWUPS=1 LONG_TARGET=smollm2 LONG_DATA=../shared/data OUT=/tmp/gdl STAGE=/tmp/stage \
#   scripts/gpu/distill.sh device_long
set -euo pipefail
SHARED=${SHARED:-../shared/data}
OUT=${OUT:-runs/kept-out}
DEADLINE=${DEADLINE:-480}
SOURCES=(sgeval sg sgv3 gsm8k datafree)
source "$(dirname "$0")/common.sh"

stage() {  # gzipped: the call that carries them also carries the repository and GGUF part 4
  rm -rf .gpu/data && mkdir -p .gpu/data/train
  for name in sg_90k_part1_html_cleaned_lang_first_sampled_sorted.json ShareGPT_V3_filtered_1000.json gsm8k_train.jsonl; do
    gzip -9 -c "$SHARED/train/$name" > ".gpu/data/train/$name.gz"
  done
  du -sh .gpu/data
}

device() {
  mkdir -p "$OUT"
  gpu_prepare
  local packed
  for packed in .gpu/data/train/*.gz; do [[ -f "${packed%.gz}" ]] || gunzip -k "$packed"; done
  local start=$SECONDS code=0
  DATA=.gpu/data TARGET="$STAGE/smollm2.gguf" timeout -s TERM -k 30 "$DEADLINE" \
    experiments/smollm2-scaling/scaling_smollm2.sh distill || code=$?
  settle 'headstart distill'  # its last shard, written on SIGTERM, before the count and the tar
  echo "distill: exit $code after $((SECONDS - start)) s (124: cut at the deadline, finished records kept)"
  local kept=()
  for source in "${SOURCES[@]}"; do [[ -f "runs/scaling/$source/distill_meta.json" ]] && kept+=("$source"); done
  python - "${kept[@]}" > "$OUT/kept.json" <<'EOF'
import json, pathlib, sys
counts = {}
for source in sys.argv[1:]:
    shards = sorted(pathlib.Path("runs/scaling", source, "data").glob("shard-*.jsonl"))
    counts[source] = sum(1 for path in shards for _ in path.open())
print(json.dumps({"records": counts, "total": sum(counts.values())}))
EOF
  cat "$OUT/kept.json"
  tar -C runs/scaling --exclude=.lock -cf - "${kept[@]}" | xz -T0 -6 | split -b 15000000 -d -a 1 - "$OUT/kept.tar.xz."
  ls -la "$OUT"
}

device_long() {  # issue 69: fresh long and multi-turn conversations, at the card's pace
  # sglong (the 304 of sg_90k's 355 long first turns the CPU did not reach), sgdocs (long-document
  # tasks: the target's document, then a task about it) and sgfollow (self-conversations: histories
  # of 1-2k tokens), replies up to 512 / 384 / 256 tokens; cut at DEADLINE,
  # finished records kept (a later call on the same machine resumes). Brought back as long.tar.xz.N.
  mkdir -p "$OUT"
  [[ ${LONG_TARGET:-} == smollm2 ]] || gpu_prepare  # the dry run: the embedded target, no staged GGUF
  local packed data=${LONG_DATA:-.gpu/data}
  for packed in "$data"/train/*.gz; do [[ -f "$packed" && ! -f "${packed%.gz}" ]] && gunzip -k "$packed"; done
  local start=$SECONDS code=0 sources=(${LONG_SOURCES:-sglong sgdocs sgfollow})
  # sgfollow from row 400 and sgdocs from row 1,800: the CPU distils from rows 0 and 1,200
  # (data/smollm2-kept/sgfollow, sgdocs); the held-out rows start at 2,858
  DATA=$data OUT=runs/long DEVICE=${DEVICE:-cuda} BATCH=${LONG_BATCH:-64} THREADS=${THREADS:-4} \
    SKIP_SGFOLLOW=${SKIP_SGFOLLOW:-400} SKIP_SGDOCS=${SKIP_SGDOCS:-1800} \
    TARGET=${LONG_TARGET:-$STAGE/smollm2.gguf} \
    timeout -s TERM -k 30 "$DEADLINE" experiments/smollm2-long/distill_long.sh "${sources[@]}" || code=$?
  settle 'headstart distill'
  echo "distill (long): exit $code after $((SECONDS - start)) s (124: cut at the deadline, finished records kept)"
  local kept=()
  for source in "${sources[@]}"; do [[ -f "runs/long/$source/distill_meta.json" ]] && kept+=("$source"); done
  ((${#kept[@]})) || { echo "distill (long): nothing finished"; return 1; }
  tar -C runs/long --exclude=.lock -cf - "${kept[@]}" | xz -T0 -6 | split -b 15000000 -d -a 1 - "$OUT/long.tar.xz."
  printf '%s\n' "${kept[@]}" > "$OUT/long.sources"
  ls -la "$OUT"
}

unpack_long() {  # here: data/smollm2-kept/<source> for each long source the window brought back
  local files=${1:?the folder holding long.tar.xz.N and long.sources}
  tmp=$(mktemp -d)
  trap 'rm -rf "${tmp:-}"' EXIT
  cat "$files"/long.tar.xz.* | xz -d | tar -C "$tmp" -xf -
  local source kept=${KEPT:-data/smollm2-kept}  # KEPT: a folder under /tmp for a dry run
  local into
  while read -r source; do
    # sglong: the device's is a superset of the kept one (packed over it); sgfollow and sgdocs hold
    # other rows than the kept ones: a folder of their own beside them (add it to the recipes)
    [[ -d "$tmp/$source" ]] || continue
    into="$kept/$source"
    [[ $source != sglong && -d $into ]] && into="$kept/$source-$(date +%Y-%m-%d)"
    if [[ $source == sglong && -d $into ]]; then  # pack refuses to overwrite: beside it, then swapped
      ${PY:-.venv/bin/python} -m headstart.distill.pack "$tmp/$source" "$into.new" && rm -rf "$into" && mv "$into.new" "$into"
    else
      ${PY:-.venv/bin/python} -m headstart.distill.pack "$tmp/$source" "$into"
    fi
  done < "$files/long.sources"
  echo "packed: $(tr '\n' ' ' < "$files/long.sources")(kept.json's long section and the README table are updated by hand)"
}

unpack() {
  local files=${1:?the folder holding kept.tar.xz.N and kept.json}
  tmp=$(mktemp -d)
  trap 'rm -rf "${tmp:-}"' EXIT
  cat "$files"/kept.tar.xz.* | xz -d | tar -C "$tmp" -xf -
  mkdir -p data/smollm2-kept
  for source in "${SOURCES[@]}"; do
    [[ -d "$tmp/$source" ]] && ${PY:-.venv/bin/python} -m headstart.distill.pack "$tmp/$source" "data/smollm2-kept/$source"
  done
  cp "$files/kept.json" data/smollm2-kept/kept.json
  du -sh data/smollm2-kept
}

"$@"
