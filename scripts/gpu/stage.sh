#!/bin/bash
# Fill .gpu/ (git-ignored) with what scripts/gpu/check.py, gpu/distill.sh and gpu/train.sh need
# on a bare GPU machine that reaches nothing: wheels for gguf (transformers reads GGUF through it)
# and datasets, the first 40 MT-bench questions, and the embedded SmolLM2 GGUF (98 MB) in four
# parts of 25 MB with its sha256 (a device call carries at most 64 MiB, the repository's ~32 MB
# included: three parts of 33 MB left no room once the kept data was committed).
# Run from the repository root:
#   scripts/gpu/stage.sh [../shared/data/eval/mt_bench/question.jsonl]
# Then the device calls, back to back (a machine stays warm ~30 s between calls; files written
# outside the repository on it stay while it is warm). A lease is 900 s of device time in all,
# start-up (~1-2 min), idle and every call included: three staging calls and ONE call of at most
# ~600 s fit; two long calls do not.
#   1. carry [".gpu/smollm2.part1"]:  mkdir -p /root/stage && cp .gpu/smollm2.part1 /root/stage/ && nvidia-smi -L
#   2. carry [".gpu/smollm2.part2"]:  mkdir -p /root/stage && cp .gpu/smollm2.part2 /root/stage/
#   3. carry [".gpu/smollm2.part3"]:  mkdir -p /root/stage && cp .gpu/smollm2.part3 /root/stage/
#   4. ONE of (each runs in the call's own shell: gpu_prepare's PATH and PYTHONPATH stay set):
#      a. the training plan: scripts/gpu/train.sh device (carry and settings in its header)
#      b. the kept data again: scripts/gpu/distill.sh device (its header)
#      c. the decode check, carry [".gpu/wheels", ".gpu/questions.jsonl", ".gpu/smollm2.part4",
#         ".gpu/smollm2.sha256"] (add ".gpu/serve-wheels", ~63 MB in all, for the serve section):
#         source scripts/gpu/common.sh && gpu_prepare && python3 scripts/gpu/check.py --out $OUT --sections smollm2 --target /root/stage/smollm2.gguf --budget 520
#         (its warm-ups alone took 190 s on an H200: with less than ~330 s left, add
#         --methods generate,plain_eager,eagle3_eager; the serving load: --sections serve, or
#         smollm2,serve, which stops timing questions with 150 s left for serve)
#      d. pytest -m gpu and the 8B-shape verify costs (no GGUF needed: calls 1-3 can be skipped),
#         carry [".gpu/wheels"]: source scripts/gpu/common.sh && python3 -m pip install -q --no-index --no-deps .gpu/wheels/*.whl && python3 scripts/gpu/check.py --out $OUT --sections pytest,shape8b --budget 520
#      e. distillation's engine against the old loop (what retiring inference/continuous.py waits on),
#         carry as in c: source scripts/gpu/common.sh && gpu_prepare && python3 scripts/bench_batchers.py
#         --target /root/stage/smollm2.gguf --device cuda --questions .gpu/questions.jsonl --num 40
#         --repeat 16 --batch-size 256 --max-new-tokens 128 --rounds 1
# A call whose machine was given back in between starts over at 1 (the staged parts are gone).
set -euo pipefail
QUESTIONS=${1:-../shared/data/eval/mt_bench/question.jsonl}
PY=${PY:-.venv/bin/python}
mkdir -p .gpu/wheels
GGUF=$($PY -c "from headstart.targets.gguf import embedded_gguf_path; print(embedded_gguf_path())")
head -n 40 "$QUESTIONS" > .gpu/questions.jsonl
# only what the image lacks (KINDS.md lists its packages; pytest, accelerate and psutil are there),
# for its Python 3.12; datasets at our version (load_distilled, train), with its two pure needs
rm -f .gpu/wheels/*.whl
$PY -m pip download -q --no-deps --only-binary :all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .gpu/wheels \
  gguf "datasets==$($PY -c 'import datasets; print(datasets.__version__)')" "dill<0.4.2" "multiprocess<0.70.20"
# `headstart serve`'s stack and the openai client (gpu/check.py's serve section), with their own
# needs, pinned to ours: carried only by a call that runs that section (~6.4 MB)
rm -rf .gpu/serve-wheels
$PY -m pip download -q --only-binary :all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .gpu/serve-wheels \
  $($PY -m pip list --format freeze 2>/dev/null | grep -i -E '^(fastapi|uvicorn|openai)==')
rm -f .gpu/smollm2.part*
split -b 25000000 --numeric-suffixes=1 -a 1 "$GGUF" .gpu/smollm2.part
(cd .gpu && sha256sum "$GGUF" | sed "s#  .*#  smollm2.gguf#" > smollm2.sha256)
ls -la .gpu .gpu/wheels
du -sh .gpu
