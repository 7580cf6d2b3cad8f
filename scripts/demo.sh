#!/usr/bin/env bash
# The README's main command (`make demo`) after installation: every stage of headstart in
# miniature on the embedded SmolLM2 target, then the shipped heads against vanilla and PLD.
set -euo pipefail
cd "$(dirname "$0")/.."
HS=.venv/bin/headstart
OUT=runs/demo
PROMPT="${PROMPT:-Explain in two sentences why the sky is blue.}"

step() { printf '\n=== %s ===\n' "$*"; }

step "1/5 the target"
$HS info --target smollm2

step "2/5 distill: the target writes its own prompts (data-free) and answers them"
$HS distill --target smollm2 --out $OUT/data --num 24 --max-new-tokens 48 --batch-size 8 --quiet

step "3/5 train: Medusa heads for a few steps on that data"
rm -rf $OUT/medusa
$HS train --recipe recipes/smollm2-medusa-demo.yaml

step "4/5 generate with the shipped default heads (same output as plain decoding, fewer target forwards)"
# torch's default threads (2 on this project's CPU): the setting the shipped trees were tuned at
$HS generate --target smollm2 --max-new-tokens 64 --prompt "$PROMPT"

step "5/5 bench: shipped heads vs vanilla generate, prompt-lookup decoding and plain headstart (same run, greedy)"
rm -rf $OUT/bench  # bench keeps a finished report: a second `make demo` measures again
$HS bench --target smollm2 --questions demo --limit 4 --max-new-tokens 64 --output $OUT/bench
echo "report: $OUT/bench/report.md (plots next to it)"
