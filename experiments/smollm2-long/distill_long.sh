#!/usr/bin/env bash
# Long-context SmolLM2 data (issue 69): the ShareGPT first turns the kept set skipped as over 256
# tokens, answered greedily by the target with replies up to 512 tokens, prompts up to 1,536.
#   held out first: sglong-eval, 48 long first turns of ShareGPT_V3 rows 800+ (never trained on)
#   sgv3long: every long first turn of ShareGPT_V3 rows 0-799 (280)
#   sglong:   every long first turn of sg_90k before its held-out rows 2858+ (355 up to 1,536)
#   sgfollow: self-conversations: sg_90k's first turns (up to 1,536 tokens: the history each later
#             turn is prompted with counts too) answered, then FOLLOWUPS more user turns the target
#             writes itself and answers, 256 tokens a reply (histories of 1-2k)
#   sgdocs:   long-document tasks: on sg_90k first turns from row 1,200 (after sgfollow's 400 and
#             their skips; before the held-out rows 2858+) the target writes a document of up to
#             768 tokens, then answers a task about it (summarise, list its points, ...), 384 tokens
# NUM_<SOURCE> (e.g. NUM_SGLONG=4) caps a source's rows (a dry run); FOLLOWUPS (default 3);
# SKIP_SGFOLLOW / SKIP_SGDOCS: the first source row (a GPU window takes rows after the CPU's).
# Resumable: rerun after a cut. On this project's 2-core CPU, beside other work, pin it to one core:
#   OMP_NUM_THREADS=1 taskset -c 1 experiments/smollm2-long/distill_long.sh
# Then pack into the kept set: python -m headstart.distill.pack runs/long/NAME data/smollm2-kept/NAME
set -euo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/long}
DEVICE=${DEVICE:-cpu}
BATCH=${BATCH:-16}
THREADS=${THREADS:-1}
TARGET=${TARGET:-smollm2}  # the embedded SmolLM2; on a GPU machine the staged GGUF
V3=$DATA/train/ShareGPT_V3_filtered_1000.json
SG=$DATA/train/sg_90k_part1_html_cleaned_lang_first_sampled_sorted.json
common=(--target "$TARGET" --dtype float32 --device "$DEVICE" --threads "$THREADS" --batch-size "$BATCH" --max-turns 1
        --max-new-tokens 512 --max-prompt-tokens 1536 --min-prompt-tokens 257 --shard-size 32)
sources=("$@")
[[ ${#sources[@]} -gt 0 ]] || sources=(sglong-eval sgv3long sglong)
for source in "${sources[@]}"; do
  case $source in
    sglong-eval) headstart distill "${common[@]}" --prompts "$V3" --out "$OUT/sglong-eval" --num "${NUM_SGLONG_EVAL:-48}" --skip-rows 800 ;;
    sgv3long) headstart distill "${common[@]}" --prompts "$V3" --out "$OUT/sgv3long" --num "${NUM_SGV3LONG:-280}" ;;
    sglong) headstart distill "${common[@]}" --prompts "$SG" --out "$OUT/sglong" --num "${NUM_SGLONG:-355}" ;;
    sgfollow) headstart distill --target "$TARGET" --dtype float32 --device "$DEVICE" --threads "$THREADS" \
        --batch-size "$BATCH" --max-turns 1 --max-new-tokens 256 --max-prompt-tokens 1536 --shard-size 32 \
        --followups "${FOLLOWUPS:-3}" --prompts "$SG" --out "$OUT/sgfollow" --num "${NUM_SGFOLLOW:-400}" \
        --skip-rows "${SKIP_SGFOLLOW:-0}" ;;
    sgdocs) headstart distill --target "$TARGET" --dtype float32 --device "$DEVICE" --threads "$THREADS" \
        --batch-size "$BATCH" --max-turns 1 --max-new-tokens 384 --max-prompt-tokens 1536 --shard-size 32 \
        --documents 768 --skip-rows "${SKIP_SGDOCS:-1200}" --prompts "$SG" --out "$OUT/sgdocs" --num "${NUM_SGDOCS:-400}" \
        datafree.temperature=0.8 ;;  # at the data-free 1.0 SmolLM2's documents rambled (a 3-row try, 2026-12-04)
    *) echo "unknown source $source (sglong-eval, sgv3long, sglong, sgfollow, sgdocs)" >&2; exit 2 ;;
  esac
done
