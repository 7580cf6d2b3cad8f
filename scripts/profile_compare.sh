#!/bin/bash
# The training-step profile of an older commit against this checkout's, in one sitting: the
# same scripts/profile_train.py (this checkout's) runs with PYTHONPATH at a git worktree of BASE
# and at this checkout alternately (base, new, base, new: ROUNDS rounds), on the same batches,
# and writes each run's JSON to OUT/{base,new}-ROUND.json; the ratio is of the best rounds.
#   scripts/profile_compare.sh e341f7a                          # the code before the fused loss and planned step
#   scripts/profile_compare.sh e341f7a mixed_precision=bf16     # more profile_train.py arguments
#   NEW_ARGS="mixed_precision=bf16 compile=true" scripts/profile_compare.sh e341f7a   # the step as it
#     can run now against the old default (overrides for this checkout's runs only)
# Environment: ROUNDS (2), OUT (runs/profile-compare), PY (.venv/bin/python), NEW_ARGS.
set -euo pipefail
BASE=${1:?usage: scripts/profile_compare.sh BASE_COMMIT [profile_train.py arguments]}
shift
HERE=$(pwd)
OUT=${OUT:-runs/profile-compare}
PY=${PY:-.venv/bin/python}
WORK=$(mktemp -d)
trap 'git -C "$HERE" worktree remove --force "$WORK/base" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
git worktree add --detach "$WORK/base" "$BASE" >/dev/null 2>&1
mkdir -p "$OUT"
for round in $(seq "${ROUNDS:-2}"); do
  for side in base new; do
    tree=$HERE; [[ $side == base ]] && tree=$WORK/base
    extra=()
    # shellcheck disable=SC2206  # the overrides are words on purpose
    [[ $side == new ]] && extra=(${NEW_ARGS:-})
    PYTHONPATH=$tree "$PY" scripts/profile_train.py "$@" "${extra[@]}" --output "$OUT/$side-$round.json" > "$OUT/$side-$round.log" 2>&1 \
      || { echo "$side failed:"; tail -5 "$OUT/$side-$round.log"; exit 1; }
    grep -E "^== " "$OUT/$side-$round.log" | sed "s/^== [^ ]*/round $round, $side/"
  done
done
"$PY" - "$OUT" "$BASE" "${NEW_ARGS:-}" <<'PY'
import json, sys
from pathlib import Path
out, base, new_args = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
runs = {side: [json.loads(p.read_text()) for p in sorted(out.glob(f"{side}-*.json"))] for side in ("base", "new")}
best = {side: max(found, key=lambda r: r["tokens_per_s"]) for side, found in runs.items()}
ratio = best["new"]["tokens_per_s"] / best["base"]["tokens_per_s"]
print(f"best train tok/s: base {base} {best['base']['tokens_per_s']:.1f}, this checkout "
      f"{best['new']['tokens_per_s']:.1f}: {ratio:.2f}x")
summary = {
    "tokens_per_s": best["new"]["tokens_per_s"],
    "base_tokens_per_s": best["base"]["tokens_per_s"],
    "ratio": round(ratio, 3),
    "base_commit": base,
    "new_args": new_args,
    "rounds": {side: [r["tokens_per_s"] for r in found] for side, found in runs.items()},
    "device": best["new"]["device"],
    "date": best["new"]["date"],
    "commit": best["new"]["commit"],
    "command": best["new"]["command"],
    "base": best["base"],
    "new": best["new"],
}
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
PY
