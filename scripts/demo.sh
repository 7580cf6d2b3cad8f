#!/usr/bin/env bash
# The README's main command (`make demo`) after installation: every stage of headstart in
# miniature on the embedded SmolLM2 target, then the shipped heads against vanilla and PLD.
# Each step says what it does, shows its progress bars, and ends with how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
HS=.venv/bin/headstart
OUT=runs/demo
PROMPT="${PROMPT:-Explain in two sentences why the sky is blue.}"
START=$SECONDS

STEP_START=$SECONDS
step() {
  STEP_START=$SECONDS
  printf '\n=== %s ===\n' "$1"
  [[ -z "${2:-}" ]] || printf '    (%s)\n' "$2"
}
took() { printf -- '--- done in %ds\n' "$((SECONDS - STEP_START))"; }

step "1/5 the target: load SmolLM2-135M-Instruct, time one token" \
  "the first run converts the embedded GGUF once (~30 s) and compiles a small C kernel"
$HS info --target smollm2
took

step "2/5 distill: the target writes 24 prompts itself (data-free), then answers them" \
  "about a minute on a 2-core CPU: the two bars are the prompts, then the replies"
$HS distill --target smollm2 --out $OUT/data --num 24 --max-new-tokens 48 --batch-size 8
took

step "3/5 train: Medusa heads for 12 steps on that data (recipes/smollm2-medusa-demo.yaml)" \
  "shows the stage working; real heads need the full recipes in recipes/"
rm -rf $OUT/medusa
$HS train --recipe recipes/smollm2-medusa-demo.yaml
took

step "4/5 generate with the shipped EAGLE-3 heads" \
  "the output is exactly the target's own greedy output; the heads only save target forwards"
# torch's default threads (2 on this project's CPU): the setting the shipped trees were tuned at
$HS generate --target smollm2 --max-new-tokens 64 --prompt "$PROMPT"
took

step "5/5 bench: shipped heads vs transformers' generate, prompt lookup and plain headstart" \
  "4 prompts, 64 tokens each, every method interleaved in one run: a minute or two"
rm -rf $OUT/bench  # bench keeps a finished report: a second `make demo` measures again
$HS bench --target smollm2 --questions demo --limit 4 --max-new-tokens 64 --output $OUT/bench
took
echo "report: $OUT/bench/report.md (plots next to it)"

cat <<EOF

=== demo finished in $((SECONDS - START))s. Next, try: ===
  .venv/bin/headstart chat --target smollm2                       # chat with the shipped heads
  .venv/bin/headstart generate --target smollm2 --no-heads --prompt "$PROMPT"   # transformers' generate, the reference
  .venv/bin/headstart serve --target smollm2 --port 8000          # an OpenAI-compatible server
  .venv/bin/headstart export --format speculators --output out/speculators   # the shipped heads, for vLLM
  .venv/bin/headstart train --recipe recipes/smollm2-eagle3-cpu.yaml --time-budget 10m
      # EAGLE-3 heads from the committed data; stops with a checkpoint, the same command + --resume goes on
Guides: docs/README.md
EOF
