# Sourced by scripts/gpu/distill.sh and scripts/gpu/train.sh on a bare GPU machine: assemble the
# staged SmolLM2 GGUF (parts 1-3 staged in $STAGE by earlier calls, the last carried in .gpu/),
# install the carried wheels, put this checkout's `headstart` on PATH and check, in seconds, that
# everything the run imports is there (a missing package found 5 minutes in costs the device call).
STAGE=${STAGE:-/root/stage}

settle() {  # PATTERN: after a `timeout` cut, wait (30 s at most) until the matching processes have
  # finished what their SIGTERM lets them finish (a distill's last shard, a run's checkpoint):
  # `timeout` returns when its direct child dies, which may be a shell before them
  local waited=0
  while pgrep -f "$1" > /dev/null 2>&1 && (( waited < 30 )); do sleep 1; waited=$((waited + 1)); done
}

gpu_prepare() {
  mkdir -p "$STAGE"
  if [[ ! -f "$STAGE/smollm2.gguf" ]]; then
    cp .gpu/smollm2.part* "$STAGE/" 2>/dev/null || true  # the part this call carries
    cat "$STAGE"/smollm2.part? > "$STAGE/smollm2.gguf"
  fi
  if ! (cd "$STAGE" && sha256sum -c "$OLDPWD/.gpu/smollm2.sha256"); then
    rm -f "$STAGE/smollm2.gguf"
    echo "error: the staged GGUF parts ($(cd "$STAGE" && ls smollm2.part? | tr '\n' ' ')) do not make the GGUF --" \
      "fix: stage every part (scripts/gpu/stage.sh's calls) on this machine, back to back" >&2
    return 1
  fi
  # python -m pip: a bare `pip` there served another interpreter (2026-11-26, H200). The image's
  # own packages stay: only the names it lacks travel (gguf, datasets, dill, multiprocess).
  if [[ -d .gpu/wheels ]] && ! python -c "import gguf, datasets" 2>/dev/null; then
    python -m pip install -q --no-index --no-deps --root-user-action=ignore .gpu/wheels/*.whl
  fi
  # `headstart serve` and its load benchmark (gpu/check.py --sections serve): fastapi, uvicorn and
  # openai with what they need beyond the image, resolved from the carried folder only
  if [[ -d .gpu/serve-wheels ]] && ! python -c "import fastapi, uvicorn, openai" 2>/dev/null; then
    python -m pip install -q --no-index --find-links .gpu/serve-wheels --root-user-action=ignore fastapi uvicorn openai
  fi
  command -v pgrep > /dev/null || echo "warning: no pgrep on this machine: the hang watchdog and settle do nothing" >&2
  mkdir -p "$STAGE/bin"  # `headstart` from this checkout (nothing to install from)
  printf '#!/bin/sh\nexec python -m headstart "$@"\n' > "$STAGE/bin/headstart"
  chmod +x "$STAGE/bin/headstart"
  export PATH="$STAGE/bin:$PATH" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  python - <<'PY'
import importlib, sys
missing = []
for name in ("torch", "transformers", "accelerate", "datasets", "gguf", "pyarrow", "safetensors",
             "headstart.distill", "headstart.train.loop"):
    try:
        module = importlib.import_module(name)
        print(f"{name} {getattr(module, '__version__', '')}".rstrip())
    except Exception as err:  # noqa: BLE001 - any import failure is fatal here
        missing.append(f"{name}: {type(err).__name__}: {err}")
import torch
print("cuda:", torch.cuda.is_available() and torch.cuda.get_device_name())
if missing:
    sys.exit("preflight failed -- " + "; ".join(missing) + " (carry the wheels: scripts/gpu/stage.sh)")
PY
}
